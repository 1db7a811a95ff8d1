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
    # summed over the concurrencies: 4 rounds split 6 ways at each
    assert "in all: the checks hold in 3 of 4 (75%)" in out
    assert "reaches 95% on the other half in 12 of 12 splits (100%)" in out
    assert "a check failed" in out


def test_commits_judge_only_their_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.report(sweep_data(), ("bbbb",)) is True
    out = capsys.readouterr().out
    assert "c=1: every check holds in 1 of 1 runs" in out
    assert "run 1: draft_model k=2" in out  # the run keeps its index among all runs
    assert "run 0:" not in out and "commit aaaa111" not in out
    assert bench.report(sweep_data(), ("aaaa",)) is False


def batch_data() -> dict:
    """The sweep of :func:`sweep_data` (draft_model k=2 best at 1), then a batch of three
    rounds measured between the runs on a busier machine where n-gram is best at 1; one run
    of that batch deployed n-gram."""
    data = sweep_data()
    busy = [
        [["base", 100.0], ["draft_model k=2", 101.0], ["ngram k=2", 120.0 + r], ["base", 100.0]]
        for r in range(3)
    ]
    slow = [["base", 50.0], ["draft_model k=2", 45.0], ["ngram k=2", 44.0], ["base", 50.0]]
    data["rounds"]["1"] += busy
    data["rounds"]["4"] += [slow] * 3
    data["round_tags"] = {c: [None] * 4 + ["b1"] * 3 for c in ("1", "4")}
    data["runs"][0]["tag"] = "b1"
    return data


def test_beside_judges_a_batch_run_against_its_own_rounds(capsys: pytest.CaptureFixture) -> None:
    data = batch_data()
    assert bench.report(data, ("aaaa",)) is False  # against all seven rounds: short at 1
    assert "run 0: ngram k=2" in capsys.readouterr().out
    assert bench.report(data, beside=True) is True  # against its three: n-gram is the best
    out = capsys.readouterr().out
    assert "c=1 (batch b1, 3 rounds beside): best ngram k=2" in out
    assert "run 1:" not in out  # no batch: not judged beside
    assert "c=1: every check holds in 1 of 1 runs" in out


def test_interleaved_runs_are_bracketed_by_tagged_rounds(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--add-runs 2 --interleave``: round, run, round, run, round; every round and run of
    the batch carries its tag and the rounds' blocks are numbered on from the sweep's."""
    data = sweep_data() | {
        "args": {"concurrency": "1,4", "seed": 0},
        "requests": {"1": {}, "4": {}},
        "runs": [],
    }
    (tmp_path / "benchmark.json").write_text(bench.json.dumps(data))
    calls: list[str] = []

    def fake_sweep(args, out, first_round=0):  # noqa: ANN001, ANN202 (the rounds' bookkeeping)
        calls.append(f"R{first_round}/{args.seed}")
        rounds = {c: [sweep_data()["rounds"][c][0]] for c in ("1", "4")}
        return {c: {"base": [(10, 0.1)]} for c in rounds}, rounds, ["draft_model", "ngram"]

    def fake_run(args, out):  # noqa: ANN001, ANN202
        calls.append("T")
        return sweep_data()["runs"][1]

    monkeypatch.setattr(bench, "sweep", fake_sweep)
    monkeypatch.setattr(bench, "one_run", fake_run)
    assert bench.add_runs(tmp_path, 2, interleave=True) == 0
    assert calls == ["R4/104", "T", "R5/105", "T", "R6/106"]
    saved = bench.json.loads((tmp_path / "benchmark.json").read_text())
    tag = saved["runs"][0]["tag"]
    assert len(saved["runs"]) == 2 and saved["runs"][1]["tag"] == tag
    assert saved["round_tags"]["1"] == [None] * 4 + [tag] * 3
    assert len(saved["rounds"]["4"]) == 7 and saved["requests"]["1"]["base"] == [[10, 0.1]] * 3
