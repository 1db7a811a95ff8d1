"""benchmarks/client_pauses.py: the pauses' summary per generation, and the hook around a run."""

from __future__ import annotations

import gc

import pytest
from bench_support import load_benchmark

pauses = load_benchmark("client_pauses.py")


def test_pauses_are_summed_per_generation() -> None:
    summary = pauses.pauses_summary([(0, 0.5), (2, 130.0), (0, 1.5), (2, 25.0), (1, 3.0)])
    assert sorted(summary) == [0, 1, 2]
    assert summary[0] == {"collections": 2, "total_ms": 2.0, "longest_ms": 1.5, "long": 0}
    assert summary[2]["long"] == 2 and summary[2]["longest_ms"] == 130.0
    assert summary[2]["total_ms"] == pytest.approx(155.0)


def test_the_run_is_timed_and_the_hook_removed(tmp_path, capsys) -> None:  # noqa: ANN001
    # spectool tune's own argument error (exit 2) still leaves the hook off and the file written
    hooks = list(gc.callbacks)
    rc = pauses.main(["--out", str(tmp_path), "--", "--concurrency", "0"])
    assert rc == 2 and gc.callbacks == hooks
    assert (tmp_path / "pauses.json").exists()
    # nothing ran: no trial wrapped, and the runner's own run_trial is what tune uses again
    data = __import__("json").loads((tmp_path / "pauses.json").read_text())
    assert data["during_trials"] == {} and data["freeze"] is True
    from spectool.measure import runner

    assert runner.run_trial.__module__ == "spectool.measure.runner"
