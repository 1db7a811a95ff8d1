"""Issue 28's quiet acceptance killers on real checkpoint metadata (tests/fixtures/ckpt/
quiet_pairs.json): each family fires on its case and stays silent on correct pairs, and
``--json`` carries every warning's code, file and evidence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ckpt_factory import CKPT_FIXTURES, fixture_tensors, write_safetensors, write_torch_bin

from spectool.ckpt.inspect import Checkpoint, inspect_folder
from spectool.cli.app import main
from spectool.compat import check_pair
from spectool.findings import Finding, Severity

QUIET = json.loads((CKPT_FIXTURES / "quiet_pairs.json").read_text())
EXPECTED = json.loads((CKPT_FIXTURES / "expected_pairs.json").read_text())["pairs"]
CORRECT = [p for p in EXPECTED if p["verdict"] == "compatible" and p["drafter"] != "self"] + QUIET[
    "silent"
]
QUIET_CODES = {case["code"] for case in QUIET["fire"]}


def _edited(make_ckpt, dest: Path, repo: str, edit: dict, side: str) -> Path:
    """``repo``'s fixture folder, or a copy of it with ``edit``'s ``side`` changes applied (the
    config merged, a model card or chat template added, tensors replaced); unchanged weight
    files are linked, not copied."""
    src = make_ckpt(repo)
    config, card = edit.get(f"{side}_config"), edit.get(f"{side}_card")
    tok_config, tensors = edit.get(f"{side}_tokenizer_config"), edit.get(f"{side}_tensors")
    if not (config or card or tok_config or tensors):
        return src
    folder = dest / f"{side}-{src.name}"
    folder.mkdir(parents=True)
    for path in src.iterdir():
        (folder / path.name).symlink_to(path)
    (folder / "config.json").unlink()
    cfg = json.loads((src / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **(config or {})}))
    if card:
        (folder / "README.md").write_text(card)
    if tok_config:
        tok_cfg = json.loads((src / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").unlink()
        (folder / "tokenizer_config.json").write_text(json.dumps({**tok_cfg, **tok_config}))
    if tensors:
        table, meta = fixture_tensors(repo)
        table.update({name: (dtype, shape) for name, (dtype, shape) in tensors.items()})
        weights = folder / meta["weight_files"][0]
        weights.unlink()
        if meta["checkpoint_format"].startswith("pytorch_bin"):
            write_torch_bin(weights, table)
        else:
            write_safetensors(weights, table)
    return folder


def _pair(make_ckpt, tmp_path: Path, case: dict) -> tuple[Checkpoint, Checkpoint]:
    edit = case.get("edit") or {}
    target_repo, hub = case["target"].removesuffix("@hub"), case["target"].endswith("@hub")
    target_dir = _edited(make_ckpt, tmp_path, target_repo, edit, "target")
    target = (
        inspect_folder(target_dir, target_repo, revision="0" * 40)
        if hub
        else inspect_folder(target_dir, str(target_dir))
    )
    drafter_dir = _edited(make_ckpt, tmp_path, case["drafter"], edit, "drafter")
    return target, inspect_folder(drafter_dir, case["drafter"])


def _loud(findings: list[Finding]) -> list[str]:
    return [f"{f.code}: {f.message}" for f in findings if f.severity is not Severity.INFO]


@pytest.mark.parametrize("pair", CORRECT, ids=[p["id"] for p in CORRECT])
def test_correct_pairs_raise_no_warning(make_ckpt, tmp_path: Path, pair: dict) -> None:
    """The repository's correct pairs, published EAGLE heads on their own targets included:
    0 warnings and 0 errors (infos such as a float16 head on a bfloat16 target may remain)."""
    target, drafter = _pair(make_ckpt, tmp_path, pair)
    assert _loud(check_pair(target, drafter, pair["method"])) == []


def test_correct_mtp_pair_raises_no_warning(make_ckpt) -> None:
    mtp = [
        p
        for p in EXPECTED + QUIET["silent"]
        if p["drafter"] == "self" and p.get("verdict", "compatible") == "compatible"
    ]
    assert mtp
    for pair in mtp:
        target = inspect_folder(make_ckpt(pair["target"]), pair["target"])
        assert _loud(check_pair(target, None, pair["method"])) == []


@pytest.mark.parametrize("case", QUIET["fire"], ids=[c["id"] for c in QUIET["fire"]])
def test_each_family_fires_on_its_evidence(make_ckpt, tmp_path: Path, case: dict) -> None:
    target, drafter = _pair(make_ckpt, tmp_path, case)
    findings = check_pair(target, drafter, case["method"], max_seq_len=case.get("max_seq_len"))
    hits = [f for f in findings if f.code == case["code"]]
    assert len(hits) == 1, [f.code for f in findings]  # said once
    hit = hits[0]
    assert hit.severity.value == case.get("severity", "warning")
    assert hit.file is not None and Path(hit.file).is_file()  # the file the evidence is in
    assert hit.evidence and hit.message and hit.hint
    # one line that says what was found, in which file, and what it costs
    assert "\n" not in hit.message and "lower than published" in hit.message
    assert f"/{Path(hit.file).name}:" in hit.message or f"/{Path(hit.file).name} " in hit.message


@pytest.mark.parametrize("case", QUIET["fire"], ids=[c["id"] for c in QUIET["fire"]])
def test_each_family_is_silent_without_its_evidence(make_ckpt, tmp_path: Path, case: dict) -> None:
    """The same pair without the edit (or, for a real pair, its correct twin) lacks the code."""
    if case["edit"]:
        twin = {**case, "edit": {}}
    elif case["code"] == "ROPE_MISMATCH":
        twin = next(p for p in QUIET["silent"] if p["drafter"] == case["drafter"])
    else:  # the deployment within the head's 2048 positions
        twin = {**case, "max_seq_len": 2048}
    target, drafter = _pair(make_ckpt, tmp_path, twin)
    findings = check_pair(target, drafter, twin["method"], max_seq_len=twin.get("max_seq_len"))
    assert case["code"] not in [f.code for f in findings if f.severity is not Severity.INFO]


def test_every_quiet_family_is_covered() -> None:
    assert {
        "ROPE_MISMATCH",
        "TIED_EMBEDDINGS_CONTRADICT",
        "MEDUSA_HEADS_DIFFER",
        "BASE_MODEL_MISMATCH",
        "BASE_MODEL_UNVERIFIED",
        "DRAFT_CONTEXT_SHORTER",
        "SPECIAL_TOKENS_DIFFER",
        "CHAT_TEMPLATE_DIFFERS",
        "DRAFT_VOCAB_NARROW",
        "QUANTIZED_TARGET_HEAD",
        "HEAD_QUANTIZED",
    } <= QUIET_CODES


def test_without_max_seq_len_a_short_head_is_an_info(make_ckpt) -> None:
    target = inspect_folder(make_ckpt("meta-llama/Llama-3.1-8B-Instruct"))
    head = inspect_folder(make_ckpt("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"))
    found = {f.code: f for f in check_pair(target, head, "eagle3")}
    assert found["DRAFT_CONTEXT_SHORTER"].severity is Severity.INFO
    assert found["DTYPE_DIFFERS"].severity is Severity.INFO  # float16 head, bfloat16 target


def test_json_carries_code_file_and_evidence(make_ckpt, capsys) -> None:
    """``check --json``: every finding has code, severity, message, hint, file and evidence."""
    code = main(
        [
            "check",
            str(make_ckpt("meta-llama/Llama-3.1-8B-Instruct")),
            str(make_ckpt("yuhuili/EAGLE-LLaMA3-Instruct-8B")),
            "--method",
            "eagle",
            "--engine",
            "none",
            "--max-seq-len",
            "4096",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["verdict"] == "compatible"
    by_code = {f["code"]: f for f in report["findings"]}
    for f in report["findings"]:
        assert {"code", "severity", "message", "hint", "file", "evidence"} <= set(f)
    rope = by_code["ROPE_MISMATCH"]
    assert rope["severity"] == "warning" and rope["file"].endswith("config.json")
    assert rope["evidence"]["target_rope"] == "theta 500000, llama3 x8"
    assert rope["evidence"]["drafter_rope"] == "theta 500000, no rope_scaling"
    ctx = by_code["DRAFT_CONTEXT_SHORTER"]
    assert ctx["severity"] == "warning" and ctx["evidence"]["max_seq_len"] == 4096


def test_model_card_metadata_is_read_safely(tmp_path: Path) -> None:
    """Front matter by yaml.safe_load: a list or a string; anything else is no evidence."""
    from spectool.ckpt.card import card_base_models

    cases = {
        "---\nbase_model: org/a\n---\ntext": ("org/a",),
        "---\nbase_model:\n- org/a\n- org/b\n---\n": ("org/a", "org/b"),
        "---\nbase_model: !!python/object/apply:os.system ['true']\n---\n": (),
        "---\n: [unclosed\n---\n": (),
        "no front matter\nbase_model: org/a\n": (),
    }
    for text, want in cases.items():
        (tmp_path / "README.md").write_text(text)
        assert card_base_models(tmp_path) == want, text


def test_rope_settings_of_both_config_layouts() -> None:
    from spectool.ckpt.card import rope_of

    v4 = rope_of({"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    v5 = rope_of({"rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8}})
    assert v4 == v5 and v4.describe() == "theta 500000, llama3 x8"
    assert rope_of({"rope_scaling": None}).scaling is None
    assert not rope_of({"hidden_size": 4096}).stated  # states nothing: no evidence


def test_a_template_that_does_not_render_is_no_evidence() -> None:
    from spectool.ckpt.card import render_template

    assert render_template("{{ raise_exception('no system role') }}", None, None) is None
    assert render_template("{{ ''.__class__.__mro__ }}", None, None) in (None, "")
    text = render_template("{% for m in messages %}<s>{{ m.content }}{% endfor %}", "<s>", None)
    assert text == "<s>Hello<s>Hi there<s>Thanks"


def test_every_checkpoint_warning_carries_its_file_and_evidence(make_ckpt, tmp_path: Path) -> None:
    """Over every fixture pair and case, each warning check_pair raises names the file it read
    and the values it rests on (the JSON's ``file`` and ``evidence``)."""
    cases = [p for p in EXPECTED if p["drafter"] != "self"] + QUIET["fire"]
    seen: set[str] = set()
    for i, case in enumerate(cases):
        target, drafter = _pair(make_ckpt, tmp_path / str(i), case)
        findings = check_pair(target, drafter, case["method"], max_seq_len=case.get("max_seq_len"))
        for f in findings:
            if f.severity is Severity.WARNING:
                seen.add(f.code)
                assert f.file and Path(f.file).is_file() and f.evidence, f
    assert QUIET_CODES - {"BASE_MODEL_MISMATCH"} <= seen


def test_model_card_lineage_and_renamed_repos_match(make_ckpt, tmp_path: Path) -> None:
    """A card naming the pretrained base (Llama-3.1-8B) or meta-llama's old repo name
    (Meta-Llama-3.1-8B-Instruct) is the Instruct target's own lineage: no finding. A card
    naming Meta-Llama-3-8B-Instruct is another model."""
    target_dir = make_ckpt("meta-llama/Llama-3.1-8B-Instruct")
    target = inspect_folder(target_dir, "meta-llama/Llama-3.1-8B-Instruct", revision="0" * 40)
    for i, (card, want) in enumerate(
        [
            ("meta-llama/Llama-3.1-8B", set()),
            ("meta-llama/Meta-Llama-3.1-8B-Instruct", set()),
            ("meta-llama/Meta-Llama-3-8B-Instruct", {"BASE_MODEL_MISMATCH"}),
        ]
    ):
        edit = {"drafter_card": f"---\nbase_model: {card}\n---\n"}
        head_dir = _edited(
            make_ckpt, tmp_path / str(i), "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", edit, "drafter"
        )
        findings = check_pair(target, inspect_folder(head_dir), "eagle3")
        assert {f.code for f in findings if f.code.startswith("BASE_MODEL")} == want, card
