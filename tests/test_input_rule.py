"""One rule for bad input (exit 2) and findings (exit 1), the same for every command; errors in
order of cause; "did you mean" for profiles, GPUs, methods and release names (issue 29)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectool.cli.app import main
from spectool.methods import METHODS
from spectool.profiles import list_gpus, list_profiles, normalize_name
from spectool.suggest import did_you_mean
from spectool.trtllm.options import RELEASES


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# Each flag several commands share, a value outside what it accepts, and the commands sharing it.
# serve's values stop before a server starts on old code too (no value there that would hang).
SHARED_BAD_VALUES = [
    ("--max-draft-len", "0", ("check", "build", "tune", "serve")),
    ("--max-draft-len", "65", ("check", "build", "tune")),
    ("--tp", "0", ("check", "build", "tune")),
    ("--max-batch-size", "0", ("check", "build", "tune", "serve")),
    ("--max-seq-len", "1", ("check", "build", "tune", "serve")),
    ("--method", "eagel3", ("check", "build", "tune", "serve")),
    ("--trtllm-version", "mian", ("check", "build", "tune")),
    ("--trtllm-backend", "pytroch", ("check", "build", "tune")),
    ("--gpu", "h100-sxn", ("check", "build", "tune")),
    ("--profile", "demoo", ("check", "build", "tune")),
    ("--concurrency", "0", ("check", "tune")),
    ("--acceptance-rate", "1.5", ("check", "tune")),
]
CASES = [(flag, value, command) for flag, value, cmds in SHARED_BAD_VALUES for command in cmds]


def _argv(command: str, flag: str, value: str, tmp_path: Path) -> list[str]:
    extra = {
        "build": ["--out", str(tmp_path / "build")],
        # --predict-only: nothing would be measured should the value pass
        "tune": ["--engine", "torch", "--predict-only", "--out", str(tmp_path / "tune")],
        "serve": ["--port", "0"],
    }.get(command, [])
    return [command, flag, value, *extra]


@pytest.mark.parametrize(("flag", "value", "command"), CASES)
def test_a_bad_flag_value_is_bad_input_on_every_command(
    capsys, tmp_path: Path, flag: str, value: str, command: str
) -> None:
    code, out, err = run(capsys, *_argv(command, flag, value, tmp_path))
    assert code == 2, (command, flag, err)
    assert err.startswith(f"spectool: error: {flag}") and err.count("\n") == 1, err
    assert out == "" and "Traceback" not in err
    assert not (tmp_path / "build").exists() and not (tmp_path / "tune").exists()


@pytest.mark.parametrize("command", ["check", "build"])
def test_the_first_problem_is_reported_not_a_later_stage(capsys, tmp_path: Path, command) -> None:
    """draft_model without a drafter, with --gpu: DRAFTER_REQUIRED (exit 1), not the prediction's
    "sizes unknown" (exit 2) that depends on the missing drafter."""
    argv = [command, "spectool:demo-target", "--method", "draft_model", "--gpu", "h100-sxm"]
    out_dir = tmp_path / "b2"
    if command == "build":
        argv += ["--out", str(out_dir)]
    code, out, err = run(capsys, *argv, "--json")
    assert code == 1, err
    report = json.loads(out)
    report = report["check"] if command == "build" else report
    assert [f["code"] for f in report["findings"] if f["severity"] == "error"] == [
        "DRAFTER_REQUIRED"
    ]
    assert "fix those first" in report["will_it_pay"]["skipped"]
    assert not out_dir.exists()


def test_a_bad_flag_comes_before_looking_for_a_gpu(capsys, tmp_path: Path) -> None:
    """build without --gpu on a machine without one: the mistyped flag is named, not the GPU."""
    code, _, err = run(capsys, "build", "--max-draft-len", "0", "--out", str(tmp_path / "b"))
    assert code == 2 and err.startswith("spectool: error: --max-draft-len"), err


def _edits(a: str, b: str) -> int:
    """Levenshtein distance."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


@pytest.mark.parametrize(
    "known",
    [list_gpus(), list_profiles(), list(METHODS), list(RELEASES)],
    ids=["gpus", "profiles", "methods", "releases"],
)
def test_every_one_letter_typo_suggests_the_name(known: list[str]) -> None:
    tried = 0
    for name in known:
        for i, char in enumerate(name):
            if not char.isalnum():
                continue
            typo = name[:i] + ("q" if char != "q" else "x") + name[i + 1 :]
            if sum(_edits(typo, other) <= 1 for other in known) > 1:
                continue  # one edit from two known names: either would be a fair guess
            tried += 1
            assert did_you_mean(typo, known, normalize_name) == name, typo
    assert tried >= len(known)
    assert did_you_mean("completely-unrelated", known, normalize_name) is None


@pytest.mark.parametrize(
    ("argv", "suggested"),
    [
        (["check", "llama-3.1-8b-eagel3"], "'llama-3.1-8b-eagle3'"),
        (["check", "--profile", "llama-3.1-8b-eagel3"], "'llama-3.1-8b-eagle3'"),
        (["check", "--gpu", "h100-sxn"], "'h100-sxm'"),
        (["check", "--gpu", "l40"], "'l40s'"),
        (["check", "--method", "draft-model"], "'draft_model'"),
        (["check", "--trtllm-version", "mian"], "'main'"),
        (["serve", "--method", "ngarm"], "'ngram'"),
    ],
)
def test_did_you_mean(capsys, argv: list[str], suggested: str) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and f"did you mean {suggested}" in err.replace("the profile ", ""), err
    assert err.count("\n") == 1
