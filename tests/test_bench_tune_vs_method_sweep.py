"""benchmarks/tune_vs_method_sweep.py: the checks, over every run or the runs of some commits."""

from __future__ import annotations

import pytest

from tests.bench_support import load_benchmark

bench = load_benchmark("tune_vs_method_sweep.py")


def sweep_data() -> dict:
    """A finished sweep at concurrency 1 and 4 (draft_model k=2 1.3x at 1, nothing pays at 4)
    and two tune runs: one deployed n-gram (short of the best at 1), one draft_model."""
    rounds = {
        "1": [
            [["base", 100.0], ["draft_model k=2", 130.0 + r], ["ngram k=2", 105.0], ["base", 100.0]]
            for r in range(4)
        ],
        "4": [
            [["base", 50.0], ["draft_model k=2", 45.0], ["ngram k=2", 44.0 + r], ["base", 50.0]]
            for r in range(4)
        ],
    }

    def run(method: str, commit: str) -> dict:
        decision = {"method": method, "schedule": {"1": 2, "4": 0}, "methods": {"why": "x"}}
        return {"decision": decision, "wall_s": 300.0, "commit": commit}

    return {
        "sweep_s": 100.0,
        "rounds": rounds,
        "runs": [run("ngram", "aaaa111"), run("draft_model", "bbbb222")],
    }


def test_every_run_is_judged_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.report(sweep_data()) is False
    out = capsys.readouterr().out
    assert "c=1: every check holds in 1 of 2 runs" in out
    assert "c=4: every check holds in 2 of 2 runs" in out
    assert "a check failed" in out


def test_commits_judge_only_their_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.report(sweep_data(), ("bbbb",)) is True
    out = capsys.readouterr().out
    assert "c=1: every check holds in 1 of 1 runs" in out
    assert "run 1: draft_model k=2" in out  # the run keeps its index among all runs
    assert "run 0:" not in out and "commit aaaa111" not in out
    assert bench.report(sweep_data(), ("aaaa",)) is False
