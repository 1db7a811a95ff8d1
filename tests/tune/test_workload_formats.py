"""tune's --workload formats and --time-scale: what reaches the prompts, and bad workloads
refused through the CLI (exit 2, one line) before anything is measured."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from spectool.cli.app import main
from spectool.errors import BadInputError
from spectool.tuning.plan import measurement_plan
from spectool.tuning.prompts import tune_prompts
from spectool.tuning.request import TuneRequest, resolve

DATA = Path(__file__).resolve().parents[1] / "data" / "workloads"


def _request(models: tuple[Path, Path], **kwargs: object) -> TuneRequest:
    target, drafter = models
    return TuneRequest(target=str(target), drafter=str(drafter), engine="torch", **kwargs)  # type: ignore[arg-type]


def test_chat_logs_are_counted_in_the_targets_chat_template(
    tune_models: tuple[Path, Path],
) -> None:
    _, prompts, setup, _ = measurement_plan(
        resolve(_request(tune_models, workload=DATA / "chat.jsonl"))
    )
    assert prompts.format == "chat"
    first = prompts.prompts[0]
    # tests/server/conftest.py's template: bos, then <role>content per message, <assistant>
    assert first.text.endswith("<system>You are terse.\n<user>Name a prime.\n<assistant>")
    assert setup.workload["id"] == prompts.workload_id


def test_sharegpt_and_trace_workloads_through_the_plan(tune_models: tuple[Path, Path]) -> None:
    _, shared, _, _ = measurement_plan(
        resolve(_request(tune_models, workload=DATA / "sharegpt.json"))
    )
    assert (shared.format, shared.skipped, len(shared.prompts)) == ("sharegpt", 2, 3)
    assert shared.to_json()["dropped_without_answer"] == 2
    req = _request(tune_models, workload=DATA / "trace.jsonl", max_seq_len=4096, time_scale=0.5)
    _, trace, _, _ = measurement_plan(resolve(req))
    assert trace.format == "trace"
    assert [p.arrival_s for p in trace.prompts] == [0.0, 0.125, 0.125, 0.75025]
    assert [p.max_tokens for p in trace.prompts] == [12, 5, 3, 7]
    _, again, _, _ = measurement_plan(resolve(dataclasses.replace(req, time_scale=1.0)))
    assert again.workload_id != trace.workload_id  # a resume sees the other time scale


def test_prompts_are_fitted_with_their_own_output_lengths(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    lines = [
        {"prompt": "a b c d e", "max_tokens": 2},  # 5 + 1 + 2 <= 10 + 4
        {"prompt": "a b c d e", "max_tokens": 9},  # 5 + 1 + 9 > 10 + 4: dropped
        {"prompt": "a b c d e f g h i"},  # the run's 4 output tokens: 9 + 1 <= 10
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))

    def words(text: str) -> int:
        return len(text.split())

    got = tune_prompts(path, 4, count_tokens=words, max_prompt_tokens=10, output_tokens=4)
    assert [p.max_tokens for p in got.prompts] == [2, None]
    assert got.dropped == 1
    assert got.format == "prompts"


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ('{"prompt": "ok"}\n{"prompt": 3}\n', "line 2: 'prompt' must be a non-empty string"),
        ('{"timestamp": 0, "input_length": 4}\n', "line 1: a trace row needs 'output_length'"),
        (
            '{"timestamp": 9, "input_length": 4, "output_length": 2}\n'
            '{"timestamp": 1, "input_length": 4, "output_length": 2}\n',
            "line 2: timestamp 1 ms is before line 1's 9 ms",
        ),
        ('{"conversations": [{"from": "human"}]}\n', "line 1: turn 1 must be an object"),
        ('{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}\n', "line 1:"),
        ("\n\n", "no prompts in the file"),
        ("[1, 2", "line 1: not valid JSON"),
    ],
)
def test_bad_workloads_exit_2_with_one_line(
    tune_models: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str,
    where: str,
) -> None:
    target, drafter = tune_models
    workload = tmp_path / "bad.jsonl"
    workload.write_text(content, encoding="utf-8")
    out = tmp_path / "run"
    args = ["tune", str(target), str(drafter), "--engine", "torch", "--workload", str(workload)]
    assert main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("spectool: error:")]
    assert len(errors) == 1 and "Traceback" not in err
    assert str(workload) in errors[0] and where in errors[0]
    assert not out.exists()  # refused before anything is measured or written


def test_time_scale_needs_a_trace(
    tune_models: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, drafter = tune_models
    args = ["tune", str(target), str(drafter), "--engine", "torch", "--out", str(tmp_path / "r")]
    assert main([*args, "--workload", str(DATA / "question.jsonl"), "--time-scale", "2"]) == 2
    assert "--time-scale: scales a trace's timestamps" in capsys.readouterr().err
    with pytest.raises(BadInputError, match="--time-scale"):
        resolve(_request(tune_models, time_scale=2.0))
