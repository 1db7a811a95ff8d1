"""`spectool check` end to end: exit codes, one JSON object, one-line errors, memory, engines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spectool.cli.app import main

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE3 = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_compatible_pair_json(make_ckpt, capsys) -> None:
    code, out, err = run(
        capsys, "check", str(make_ckpt(LLAMA)), str(make_ckpt(EAGLE3)), "--engine", "none", "--json"
    )
    assert code == 0, err
    report = json.loads(out)
    assert (
        report["verdict"] == "compatible"
        and report["method"] == "eagle3"
        and report["engine"] == "none"
    )
    assert report["target"]["kind"] == "causal_lm" and report["drafter"]["kind"] == "eagle3"
    assert {"code", "severity", "message", "hint"} <= set(report["findings"][0])
    assert report["memory"] is None  # no GPU here and none named


def test_incompatible_pair_exit_1_and_table(make_ckpt, capsys) -> None:
    code, out, _ = run(
        capsys,
        "check",
        str(make_ckpt(LLAMA)),
        str(make_ckpt("yuhuili/EAGLE-LLaMA3-Instruct-8B")),
        "--method",
        "eagle3",
        "--engine",
        "none",
    )
    assert code == 1
    assert "WRONG_EAGLE_GENERATION_EAGLE1_AS_EAGLE3" in out and "incompatible" in out


def test_memory_estimate_and_budget(make_ckpt, capsys) -> None:
    code, out, _ = run(
        capsys,
        "check",
        str(make_ckpt(LLAMA)),
        str(make_ckpt(EAGLE3)),
        "--engine",
        "none",
        "--gpu",
        "h100-sxm",
        "--max-seq-len",
        "8192",
        "--json",
    )
    mem = json.loads(out)["memory"]
    assert code == 0
    assert mem["target_weight_bytes"] == 16060522496
    # Llama-3.1-8B: 32 layers x 2 x 8 KV heads x 128 x 2 bytes = 131072 B per token.
    assert mem["target_kv_bytes_per_token"] == 131072
    assert 0 < mem["sequences_with_drafter"] < mem["sequences_without_drafter"]
    ds = str(make_ckpt("deepseek-ai/DeepSeek-V3"))
    code, out, _ = run(
        capsys,
        "check",
        ds,
        "self",
        "--method",
        "mtp",
        "--engine",
        "none",
        "--gpu",
        "h100-sxm",
        "--json",
    )
    assert code == 1 and "MEMORY_BUDGET" in {f["code"] for f in json.loads(out)["findings"]}
    code, out, _ = run(
        capsys,
        "check",
        ds,
        "--method",
        "mtp",
        "--engine",
        "none",
        "--gpu",
        "h200",
        "--tp",
        "8",
        "--json",
    )
    report = json.loads(out)
    assert code == 0, report["findings"]
    # MLA: 61 layers x (512 + 64) x 2 bytes, not split by TP.
    assert report["memory"]["target_kv_bytes_per_token"] == 61 * 576 * 2


def test_embedded_engine_rules(make_ckpt, capsys) -> None:
    code, out, _ = run(
        capsys,
        "check",
        str(make_ckpt(LLAMA)),
        str(make_ckpt("yuhuili/EAGLE-LLaMA3-Instruct-8B")),
        "--engine",
        "torch",
        "--json",
    )
    assert code == 1  # EAGLE-1 heads: TensorRT-LLM only
    assert "UNSUPPORTED_BY_ENGINE" in {f["code"] for f in json.loads(out)["findings"]}
    code, out, _ = run(
        capsys,
        "check",
        str(make_ckpt(LLAMA)),
        str(make_ckpt(EAGLE3)),
        "--engine",
        "torch",
        "--json",
    )
    assert code == 0, out  # EAGLE-3 heads run on the embedded engine
    code, out, _ = run(
        capsys,
        "check",
        str(make_ckpt(LLAMA)),
        str(make_ckpt("meta-llama/Llama-3.2-1B-Instruct")),
        "--engine",
        "torch",
        "--json",
    )
    assert code == 0, out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["check", "/nonexistent/model", "--engine", "none"], "/nonexistent/model"),
        (["check", "--profile", "no-such-profile"], "no-such-profile"),
        (["check", "--method", "bogus", "--engine", "none"], "bogus"),
        (["check", "--engine", "vllm"], "vllm"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv: list[str], needle: str) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err and out == ""


def test_malformed_and_hostile_files_exit_2(make_ckpt, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    code, _, err = run(capsys, "check", str(bad), "--engine", "none")
    assert code == 2 and "config.json" in err and "malformed JSON" in err
    (bad / "config.json").write_text("{}")
    (bad / "model.safetensors").write_bytes((10**12).to_bytes(8, "little") + b"{}")
    code, _, err = run(capsys, "check", str(bad), "--engine", "none")
    assert code == 2 and "model.safetensors" in err and err.count("\n") == 1


def test_help_imports_neither_torch_nor_transformers() -> None:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "spectool.cli.app", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "120"},
    )
    modules = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert "check" in out.stdout
    assert not {"torch", "transformers", "fastapi", "uvicorn", "matplotlib"} & modules


@pytest.mark.parametrize(
    "argv", [["check", "--bogus"], ["check", "--tp", "many"], ["nosuchcommand"]]
)
def test_usage_errors_exit_2_without_traceback(capsys, argv: list[str]) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "Traceback" not in err


def _with_config(make_ckpt, folder: Path, config: dict | str) -> Path:
    """Llama-3.2-1B's real weights (linked) beside ``config`` (a dict, or raw JSON text)."""
    src = make_ckpt("meta-llama/Llama-3.2-1B-Instruct")
    folder.mkdir()
    for weights in src.glob("*.safetensors"):
        (folder / weights.name).symlink_to(weights)
    raw = config if isinstance(config, str) else json.dumps(config)
    (folder / "config.json").write_text(raw)
    return folder


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (None, "hidden_size"),  # {}: nothing the verdict needs
        ({"hidden_size": "big"}, "hidden_size"),
        ({"hidden_size": float("nan")}, "hidden_size"),
        ({"vocab_size": 0, "hidden_size": 0}, "hidden_size"),
        ({"num_hidden_layers": -3}, "num_hidden_layers"),
        ({"vocab_size": 10**15}, "vocab_size"),
        ({"hidden_size": 2048.0}, "hidden_size"),
        ({"max_position_embeddings": True}, "max_position_embeddings"),
        ({"vocab_size": None}, "vocab_size"),
    ],
)
def test_broken_config_is_bad_input_not_compatible(
    make_ckpt, tmp_path: Path, capsys, change: dict | None, field: str
) -> None:
    real = json.loads((make_ckpt("meta-llama/Llama-3.2-1B-Instruct") / "config.json").read_text())
    config = {} if change is None else {**real, **change}
    folder = _with_config(make_ckpt, tmp_path / "broken", config)
    for argv in ([str(folder)], [str(make_ckpt(LLAMA)), str(folder)]):
        code, out, err = run(capsys, "check", *argv, "--engine", "none")
        assert code == 2, out
        assert err.count("\n") == 1 and "Traceback" not in err
        assert f"{folder}/config.json" in err and field in err and "compatible" not in out


def test_deeply_nested_json_is_one_line(make_ckpt, tmp_path: Path, capsys) -> None:
    folder = _with_config(
        make_ckpt, tmp_path / "deep", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    )
    code, _, err = run(capsys, "check", str(folder), "--engine", "none")
    assert code == 2 and err.count("\n") == 1 and "nested deeper than 64" in err
    header = json.dumps({"x": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}}).encode()
    header = header[:-1] + b', "y": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    shard = tmp_path / "deep-header"
    shard.mkdir()
    (shard / "config.json").write_text("{}")
    (shard / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0\0")
    code, _, err = run(capsys, "check", str(shard), "--engine", "none")
    assert code == 2 and err.count("\n") == 1 and "nested deeper than 64" in err


def test_absurd_draft_length_is_bad_input(make_ckpt, capsys) -> None:
    """A flag value outside its range is bad input (exit 2, README "Exit codes"), not a finding."""
    code, out, err = run(
        capsys,
        "check",
        str(make_ckpt(LLAMA)),
        str(make_ckpt("meta-llama/Llama-3.2-1B-Instruct")),
        "--max-draft-len",
        "1000000000",
        "--engine",
        "none",
    )
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("spectool: error: --max-draft-len: must be between 1 and 64")


def _at_80_columns(*argv: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "spectool.cli.app", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80", "LINES": "50"},
        check=False,
        timeout=120,
    )
    assert out.returncode in (0, 1), out.stderr
    return out.stdout.splitlines()


def test_help_and_tables_fit_80_columns_without_broken_tokens() -> None:
    for command in ("check", "serve", "build"):
        lines = _at_80_columns(command, "--help")
        assert all(len(line) <= 80 for line in lines) and not any("…" in line for line in lines)
    text = "\n".join(_at_80_columns("check", "--help"))
    assert "medusa" in text and "draft_model" in text and "--trtllm-backend" in text
    # The demo pair swapped: a findings table with long words, and the checkpoint facts.
    lines = _at_80_columns(
        "check", "spectool:demo-drafter", "spectool:demo-target", "--engine", "torch"
    )
    assert all(len(line) <= 80 for line in lines)
    for token in (
        "spectool:demo-drafter",
        "spectool:demo-target",
        "LlamaForCausalLM",
        "float16",
        "DRAFTER_NOT_CHEAPER",
        "parameters",
    ):
        assert any(token in line for line in lines), token


def test_demo_target_mtp_is_checked_as_mtp_and_the_plain_target_has_no_mtp_layers(
    capsys,
) -> None:
    """``check spectool:demo-target-mtp self``: method mtp from the target's own layer 12,
    compatible on the embedded engine and by the checkpoint rules; TensorRT-LLM runs MTP only in
    DeepSeek-family model code, so its rules refuse this Llama. The plain demo target, given
    ``self``, gets the no-MTP-layers finding (``self`` never falls back to n-gram)."""
    for engine in ("torch", "none"):
        code, out, err = run(
            capsys, "check", "spectool:demo-target-mtp", "self", "--engine", engine, "--json"
        )
        report = json.loads(out)
        assert code == 0, err + out
        assert (report["verdict"], report["method"]) == ("compatible", "mtp")
        assert report["target"]["mtp_layers"] == 1 and report["drafter"] is None
        assert report["max_draft_len"] == 1  # the default for mtp: the target's MTP layers
    code, out, _ = run(capsys, "check", "spectool:demo-target-mtp", "--engine", "none", "--json")
    assert (code, json.loads(out)["method"]) == (0, "mtp")  # auto without a drafter
    code, out, _ = run(capsys, "check", "spectool:demo-target-mtp", "self", "--json")
    codes = {f["code"]: f["message"] for f in json.loads(out)["findings"]}
    assert code == 1 and "LlamaForCausalLM" in codes["UNSUPPORTED_BY_TRTLLM"]
    assert "NO_NATIVE_MTP" not in codes
    for engine in ("torch", "none", "trtllm"):
        code, out, _ = run(
            capsys, "check", "spectool:demo-target", "self", "--engine", engine, "--json"
        )
        report = json.loads(out)
        codes = {f["code"] for f in report["findings"]}
        assert code == 1 and report["method"] == "mtp" and "NO_NATIVE_MTP" in codes, engine
    code, out, _ = run(capsys, "check", "spectool:demo-target-mtp", "self", "--engine", "torch")
    assert code == 0 and "method mtp" in out and "compatible" in out
