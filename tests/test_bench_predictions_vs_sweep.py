"""benchmarks/predictions_vs_sweep.py: the sweep's truth, a run's predictions, the residuals."""

from __future__ import annotations

import gzip
import json
import math

import pytest
from bench_support import load_benchmark

bench = load_benchmark("predictions_vs_sweep.py")


def _sweep(rounds: dict[str, list[list[list[object]]]]) -> dict[str, object]:
    return {"rounds": rounds}


def test_the_truth_is_one_over_the_bracketed_speedup_pooled_over_rounds_and_sweeps() -> None:
    # baseline 100 tok/s around each configuration; draft_model k=2 at 125 then 80 / 0.8 = 100
    one = _sweep({"4": [[["base", 100.0], ["draft_model k=2", 125.0], ["base", 100.0]]]})
    two = _sweep({"4": [[["base", 80.0], ["draft_model k=2", 100.0], ["base", 80.0]]]})
    truth = bench.sweep_truth([one, two])
    assert truth == {("draft_model", 4, 2): pytest.approx(0.8)}
    slower = _sweep({"4": [[["base", 100.0], ["draft_model k=2", 50.0], ["base", 100.0]]]})
    assert bench.sweep_truth([one, slower])[("draft_model", 4, 2)] == pytest.approx(
        math.sqrt(0.8 * 2.0)
    )


def test_residuals_per_concurrency_from_a_runs_tune_json(tmp_path) -> None:  # noqa: ANN001
    for method, preds in {
        "draft_model": [(1, 0, 1.0), (1, 2, 0.5), (4, 2, 0.9)],
        "ngram": [(1, 2, 0.7)],
    }.items():
        (tmp_path / method).mkdir()
        (tmp_path / method / "tune.json").write_text(
            json.dumps(
                {
                    "setup": {"method": method},
                    "predictions": [{"concurrency": c, "k": k, "ratio": r} for c, k, r in preds],
                }
            )
        )
    predicted = bench.run_predictions(tmp_path)
    assert predicted == {
        ("draft_model", 1, 2): 0.5,
        ("draft_model", 4, 2): 0.9,
        ("ngram", 1, 2): 0.7,
    }  # k = 0 is no prediction
    truth = {("draft_model", 1, 2): 0.6, ("draft_model", 4, 2): 0.9, ("ngram", 1, 2): 0.7}
    got = bench.residuals(truth, [predicted])
    assert got["1"] == pytest.approx([math.log(0.6 / 0.5), 0.0])
    assert got["4"] == pytest.approx([0.0]) and len(got["all"]) == 3
    s = bench.summary([-0.3, -0.1, 0.0, 0.1, 0.2, 0.2, 0.3, 0.3, 0.4, 0.5])
    assert s["n"] == 10 and s["p10"] == -0.3 and s["p90"] == 0.4
    assert s["mean"] == pytest.approx(0.16) and s["rms"] > s["mean"]


def test_a_missing_sweep_is_exit_2(tmp_path, capsys) -> None:  # noqa: ANN001
    assert bench.main(["--sweep", str(tmp_path / "none"), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "none" in err


def test_ranking_records_and_fixture_from_runs(tmp_path) -> None:  # noqa: ANN001
    """A run's per-concurrency predictions and measured draft lengths, the ranking residual
    against the nearest measured neighbour, and the fixture written per workload label."""
    run = tmp_path / "tune-0"
    (run / "draft_model").mkdir(parents=True)
    (run / "draft_model" / "tune.json").write_text(
        json.dumps(
            {
                "setup": {"method": "draft_model"},
                "cells": [
                    {"concurrency": 1, "k": 0, "verdict": None},
                    {"concurrency": 1, "k": 4, "verdict": {"ratio": 0.8}},
                ],
                "predictions": [
                    {"concurrency": 1, "k": k, "ratio": r}
                    for k, r in ((0, 1.0), (2, 0.7), (4, 0.8))
                ],
            }
        )
    )
    records = bench.run_records(run)
    assert records == [
        {
            "run": "tune-0",
            "method": "draft_model",
            "concurrency": 1,
            "predicted": {"2": 0.7, "4": 0.8},
            "measured": [4],
        }
    ]
    truth = {("draft_model", 1, 2): 0.6, ("draft_model", 1, 4): 0.8}
    got = bench.ranking_residuals(truth, records)
    # truth says k=2 is 0.75 of k=4, the model 0.875: 14% too pessimistic
    assert got["batch1"] == pytest.approx([math.log(0.75) - math.log(0.875)])
    assert got["batched"] == []
    fixture = tmp_path / "k.json.gz"
    bench.write_ranking(fixture, "code", truth, records)
    bench.write_ranking(fixture, "prose", truth, records)
    bench.write_ranking(fixture, "code", truth, records)  # replaced, not added twice
    data = json.loads(gzip.decompress(fixture.read_bytes()))
    assert [w["label"] for w in data["workloads"]] == ["prose", "code"]
    assert data["workloads"][1]["truth"] == [["draft_model", 1, 2, 0.6], ["draft_model", 1, 4, 0.8]]
