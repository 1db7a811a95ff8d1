"""Every verdict and code in tests/fixtures/ckpt/EXPECTED.md holds, plus the token-space
warnings on real tokenizers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from ckpt_factory import CKPT_FIXTURES, write_tokenizer

from spectool.ckpt.inspect import inspect_folder
from spectool.compat import check_pair, resolve_method
from spectool.findings import Severity

PAIRS = json.loads((CKPT_FIXTURES / "expected_pairs.json").read_text())["pairs"]


@pytest.mark.parametrize("pair", PAIRS, ids=[p["id"] for p in PAIRS])
def test_expected_pairs(make_ckpt, pair: dict) -> None:
    target = inspect_folder(make_ckpt(pair["target"]), pair["target"])
    drafter = (
        None
        if pair["drafter"] == "self"
        else inspect_folder(make_ckpt(pair["drafter"]), pair["drafter"])
    )
    findings = check_pair(target, drafter, pair["method"])
    errors = sorted(f.code for f in findings if f.severity is Severity.ERROR)
    assert errors == sorted(pair["reasons"])
    verdict = "incompatible" if errors else "compatible"
    assert verdict == pair["verdict"]
    for f in findings:
        assert f.message and f.hint


def test_auto_method_reads_the_weights(make_ckpt) -> None:
    target = inspect_folder(make_ckpt("meta-llama/Llama-3.1-8B-Instruct"))
    e3 = inspect_folder(make_ckpt("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"))
    e1 = inspect_folder(make_ckpt("yuhuili/EAGLE-LLaMA3-Instruct-8B"))
    small = inspect_folder(make_ckpt("meta-llama/Llama-3.2-1B-Instruct"))
    ds = inspect_folder(make_ckpt("deepseek-ai/DeepSeek-V3"))
    assert resolve_method("auto", target, e3) == "eagle3"
    assert resolve_method("auto", target, e1) == "eagle"
    assert resolve_method("auto", target, small) == "draft_model"
    assert resolve_method("auto", ds, None) == "mtp"
    assert resolve_method("auto", target, None) == "ngram"


def _variant(
    make_ckpt, tmp_path: Path, repo: str, name: str, tokenizer_keep: int | None, **config
) -> Path:
    dest = tmp_path / name
    shutil.copytree(make_ckpt(repo), dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg.update(config)
    (dest / "config.json").write_text(json.dumps(cfg))
    if tokenizer_keep is not None:
        write_tokenizer(dest, "qwen3", tokenizer_keep)
    return dest


def test_padded_vocab_and_superset_warnings(make_ckpt, tmp_path: Path) -> None:
    # Qwen2.5-7B (152064 rows, 151665 tokens) with a Qwen3 drafter (151936 rows, 151669 tokens).
    target = inspect_folder(make_ckpt("Qwen/Qwen2.5-7B-Instruct"))
    drafter = inspect_folder(make_ckpt("Qwen/Qwen3-0.6B"))
    findings = check_pair(target, drafter, "draft_model")
    codes = {f.code: f for f in findings}
    assert not [f for f in findings if f.severity is Severity.ERROR]
    assert {"PADDED_VOCAB_DIFFERS", "TOKENIZER_SUPERSET"} <= set(codes)
    assert (
        "152064" in codes["PADDED_VOCAB_DIFFERS"].message
        and "151936" in codes["PADDED_VOCAB_DIFFERS"].message
    )
    # The converse: a Qwen3 target with a Qwen2.5-tokenizer drafter -> the target is the superset.
    old = _variant(make_ckpt, tmp_path, "Qwen/Qwen3-0.6B", "q25-draft", 151665)
    target3 = inspect_folder(make_ckpt("Qwen/Qwen3-8B"))
    f2 = {f.code: f for f in check_pair(target3, inspect_folder(old), "draft_model")}
    assert (
        "TOKENIZER_SUPERSET" in f2
        and "4 tokens the drafter never saw" in f2["TOKENIZER_SUPERSET"].message
    )


def test_eagle3_reduced_vocab_needs_d2t(make_ckpt, tmp_path: Path) -> None:
    from ckpt_factory import fixture_tensors, write_torch_bin

    tensors, _ = fixture_tensors("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    dest = tmp_path / "no-d2t"
    dest.mkdir()
    shutil.copy(
        make_ckpt("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B") / "config.json", dest / "config.json"
    )
    write_torch_bin(dest / "pytorch_model.bin", {k: v for k, v in tensors.items() if k != "d2t"})
    target = inspect_folder(make_ckpt("meta-llama/Llama-3.1-8B-Instruct"))
    codes = {f.code for f in check_pair(target, inspect_folder(dest), "eagle3")}
    assert "DRAFT_VOCAB_MAP_MISSING" in codes


def test_mtp_draft_len_and_base_model(make_ckpt) -> None:
    ds = inspect_folder(make_ckpt("deepseek-ai/DeepSeek-V3"))
    f = {x.code: x for x in check_pair(ds, None, "mtp", max_draft_len=3)}
    assert "MTP_DRAFT_LEN" in f and "replays" in f["MTP_DRAFT_LEN"].message
    # A Hub reference (it has a revision) names the target's identity.
    target = inspect_folder(
        make_ckpt("meta-llama/Llama-2-7b-chat-hf"),
        "meta-llama/Llama-2-7b-chat-hf",
        revision="0" * 40,
    )
    head = inspect_folder(make_ckpt("yuhuili/EAGLE-llama2-chat-7B"))
    object.__setattr__(
        head, "config", {**head.config, "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}
    )
    codes = {x.code for x in check_pair(target, head, "eagle") if x.severity is Severity.ERROR}
    assert codes == {"BASE_MODEL_MISMATCH"}


# -- base-model identity (Medusa heads on a Vicuna-shaped target) ------------------------------


def _medusa_head(folder: Path, base: str) -> Path:
    from ckpt_factory import write_torch_bin

    folder.mkdir(parents=True)
    config = {"medusa_num_heads": 2, "medusa_num_layers": 1, "base_model_name_or_path": base}
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {}
    for h in range(2):
        tensors[f"{h}.0.linear.weight"] = ("F16", [4096, 4096])
        tensors[f"{h}.0.linear.bias"] = ("F16", [4096])
        tensors[f"{h}.1.weight"] = ("F16", [32000, 4096])
    write_torch_bin(folder / "medusa_lm_head.pt", tensors)
    return folder


def _target_at(make_ckpt, folder: Path, **config) -> Path:
    """The Llama-2-7B fixture (Vicuna's shape) at ``folder``: its config, weights linked."""
    src = make_ckpt("meta-llama/Llama-2-7b-chat-hf")
    folder.mkdir(parents=True)
    cfg = json.loads((src / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **config}))
    for weights in src.glob("model*.safetensors*"):
        (folder / weights.name).symlink_to(weights)
    return folder


def _base_findings(target: Path, head: Path) -> dict[str, Severity]:
    findings = check_pair(inspect_folder(target, str(target)), inspect_folder(head), "medusa")
    return {f.code: f.severity for f in findings if f.code.startswith("BASE_MODEL")}


def test_base_model_identity_of_local_folders(make_ckpt, tmp_path: Path) -> None:
    head = _medusa_head(tmp_path / "medusa", "lmsys/vicuna-7b-v1.3")
    # A local copy named like the model, a Hugging Face cache snapshot, a matching _name_or_path.
    copy = _target_at(make_ckpt, tmp_path / "models" / "vicuna-7b-v1.3")
    snap = tmp_path / "hub" / "models--lmsys--vicuna-7b-v1.3" / "snapshots" / ("a" * 40)
    cached = _target_at(make_ckpt, snap)
    named = _target_at(make_ckpt, tmp_path / "prod" / "llm", _name_or_path="lmsys/vicuna-7b-v1.3")
    for target in (copy, cached, named):
        assert _base_findings(target, head) == {}, target
    # A folder of another name and nothing else to go by: a warning, not an error.
    anon = _target_at(make_ckpt, tmp_path / "models" / "chatbot")
    assert _base_findings(anon, head) == {"BASE_MODEL_UNVERIFIED": Severity.WARNING}
    # Known identities that differ: the cache path or _name_or_path of another model.
    other = tmp_path / "hub" / "models--meta-llama--Llama-2-7b-chat-hf" / "snapshots" / ("b" * 40)
    for target in (
        _target_at(make_ckpt, other),
        _target_at(make_ckpt, tmp_path / "x" / "llm", _name_or_path="meta-llama/Llama-2-7b-hf"),
    ):
        assert _base_findings(target, head) == {"BASE_MODEL_MISMATCH": Severity.ERROR}, target


def test_swapped_pair_is_a_warning(make_ckpt) -> None:
    small = inspect_folder(make_ckpt("meta-llama/Llama-3.2-1B-Instruct"))
    large = inspect_folder(make_ckpt("meta-llama/Llama-3.1-8B-Instruct"))
    swapped = {f.code: f for f in check_pair(small, large, "draft_model")}
    assert swapped["DRAFTER_NOT_CHEAPER"].severity is Severity.WARNING
    assert "32 layers" in swapped["DRAFTER_NOT_CHEAPER"].message
    assert "DRAFTER_NOT_CHEAPER" not in {f.code for f in check_pair(large, small, "draft_model")}


@pytest.mark.parametrize("k", [0, 65, 1_000_000_000])
def test_draft_length_out_of_range_is_an_error(make_ckpt, k: int) -> None:
    target = inspect_folder(make_ckpt("meta-llama/Llama-3.1-8B-Instruct"))
    drafter = inspect_folder(make_ckpt("meta-llama/Llama-3.2-1B-Instruct"))
    findings = check_pair(target, drafter, "draft_model", max_draft_len=k)
    assert [f.code for f in findings if f.severity is Severity.ERROR] == ["MAX_DRAFT_LEN_INVALID"]
    at_limit = check_pair(target, drafter, "draft_model", max_draft_len=64)
    assert not [f for f in at_limit if f.severity is Severity.ERROR]
