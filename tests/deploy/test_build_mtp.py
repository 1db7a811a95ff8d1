"""``spectool build`` for MTP: the release-exact ``speculative_config`` for every release, gates
only where the release honours them, and relaxed acceptance (lossy) only when asked."""

from __future__ import annotations

import json

import pytest
import yaml

from spectool.cli.app import main
from spectool.trtllm.gates import gate_support
from spectool.trtllm.validate import validate_options

DEEPSEEK = "deepseek-ai/DeepSeek-V3"
VERSIONS = {"0.21": "0.21.0", "1.0": "1.0.0", "1.1": "1.1.0", "1.2": "1.2.1", "main": "1.3.0rc24"}
RELAXED_KEYS = {"use_relaxed_acceptance_for_thinking", "relaxed_topk", "relaxed_delta"}


def _build(capsys, make_ckpt, out, release: str, *extra: str) -> tuple[int, str]:
    argv = ["build", str(make_ckpt(DEEPSEEK)), "self", "--method", "mtp", "--gpu", "h200"]
    argv += ["--tp", "8", "--max-draft-len", "3", "--trtllm-version", VERSIONS[release]]
    code = main([*argv, "--out", str(out), *extra])
    stdout, err = capsys.readouterr()
    return code, stdout + err


@pytest.mark.parametrize("release", list(VERSIONS))
def test_mtp_config_is_release_exact_and_never_relaxed_unasked(
    release: str, make_ckpt, tmp_path, capsys
) -> None:
    out = tmp_path / "b"
    code, text = _build(capsys, make_ckpt, out, release)
    assert code == 0, text
    spec = yaml.safe_load((out / "speculative.yaml").read_text())
    validate_options(spec, release, "pytorch")
    # up to 1.2 the MTP depth is num_nextn_predict_layers (= max_draft_len); main deprecates it
    want = {"decoding_type": "MTP", "max_draft_len": 3}
    if release != "main":
        want["num_nextn_predict_layers"] = 3
    assert spec["speculative_config"] == want
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["runtime_gate"] is None  # no decision given: no gate
    assert manifest["commands"]["build"][2:4][1] == "self"  # the target's own MTP layers
    assert not any("relaxed" in n for n in manifest["notes"])


@pytest.mark.parametrize("release", ["1.2", "main"])
def test_relaxed_acceptance_only_when_asked_and_said_to_be_lossy(
    release: str, make_ckpt, tmp_path, capsys
) -> None:
    out = tmp_path / "b"
    code, text = _build(capsys, make_ckpt, out, release, "--mtp-relaxed-acceptance", "10,0.6")
    assert code == 0, text
    spec = yaml.safe_load((out / "speculative.yaml").read_text())["speculative_config"]
    assert {k: spec[k] for k in RELAXED_KEYS} == {
        "use_relaxed_acceptance_for_thinking": True,
        "relaxed_topk": 10,
        "relaxed_delta": 0.6,
    }
    manifest = json.loads((out / "manifest.json").read_text())
    assert any("lossy" in n for n in manifest["notes"])
    assert manifest["commands"]["build"][-2:] == ["--mtp-relaxed-acceptance", "10,0.6"]
    assert "lossy" in text
    baseline = yaml.safe_load((out / "baseline.yaml").read_text())
    assert "speculative_config" not in baseline


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--mtp-relaxed-acceptance", "ten"], "TOPK,DELTA"),
        (["--mtp-relaxed-acceptance", "0,0.6"], "TOPK must be >= 1"),
        (["--mtp-relaxed-acceptance", "10,0.6", "--method", "ngram"], "mtp on TensorRT-LLM only"),
    ],
)
def test_relaxed_acceptance_bad_input_is_one_line_exit_2(
    extra: list[str], needle: str, make_ckpt, tmp_path, capsys
) -> None:
    llama = str(make_ckpt("meta-llama/Llama-3.1-8B-Instruct"))
    target = llama if "ngram" in extra else str(make_ckpt(DEEPSEEK))
    argv = ["build", target, *(["self"] if "ngram" not in extra else [])]
    argv += ["--gpu", "h200", "--tp", "8", "--out", str(tmp_path / "b"), *extra]
    code = main(argv)
    _, err = capsys.readouterr()
    assert code == 2 and needle in err and err.count("\n") == 1
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("release", ["1.1", "1.2", "main"])
def test_mtp_gate_written_only_where_the_release_honours_it(
    release: str, make_ckpt, tmp_path, capsys
) -> None:
    """A decision that turns speculation off above concurrency 8: main (one MTP layer,
    MTP-Eagle) writes the schedule; 1.1 and 1.2 ignore it for MTP, so nothing is written and
    serve's cost gate is left to act."""
    cells = [
        {"concurrency": c, "k": 3, "lhs_ms_per_token": 6.0 if c <= 8 else 11.0}
        | {"rhs_ms_per_token": 10.0, "ratio": 0.6 if c <= 8 else 1.1}
        | {"ci_low": 0.55 if c <= 8 else 1.05, "ci_high": 0.65 if c <= 8 else 1.15}
        | {"verdict": "pays" if c <= 8 else "does_not_pay"}
        for c in (1, 8, 64)
    ]
    decision = tmp_path / "decision.json"
    decision.write_text(
        json.dumps(
            {
                "engine": "tensorrt-llm",
                "method": "mtp",
                "max_draft_len": 3,
                "schedule": {"1": 3, "8": 3, "64": 0},
                "break_even_concurrency": 64,
                "cells": cells,
            }
        )
    )
    out = tmp_path / "b"
    code, text = _build(
        capsys, make_ckpt, out, release, "--decision", str(decision), "--max-batch-size", "128"
    )
    assert code == 0, text
    spec = yaml.safe_load((out / "speculative.yaml").read_text())["speculative_config"]
    manifest = json.loads((out / "manifest.json").read_text())
    honoured = release == "main"  # PR #12262; 1.1/1.2 check the gate only with a drafter
    assert gate_support(release, "mtp", mtp_layers=1).effective == honoured
    assert (manifest["runtime_gate"] is not None) == honoured
    assert ("draft_len_schedule" in spec or "max_concurrency" in spec) == honoured
    assert not RELAXED_KEYS & set(spec)
