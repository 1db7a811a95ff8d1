"""benchmarks/predict_cpu.py judges a cell at concurrency c on the steps that carry c sequences.

Speculative requests that start together finish on different steps; the steps after the first
one finishes run a smaller batch, at a higher cost per token, while the baseline's requests
finish together. The prediction is for batch c, so the measurement must be too.
"""

from __future__ import annotations

import pytest
from bench_support import load_benchmark

from spectool.engine.records import IterationStats


def step(ms: float, decoded: int, accepted: int, new: int = 0) -> IterationStats:
    """One k=1 iteration: ``decoded`` sequences, ``accepted`` of their drafts accepted."""
    return IterationStats(
        timestamp=0.0, iter=0, iter_latency_ms=ms, num_active_requests=decoded,
        num_queued_requests=0, num_new_active_requests=new, num_completed_requests=0,
        max_batch_size=8, max_num_tokens=8 * 256, used_num_tokens=0, prefill_ms=0.0,
        draft_ms=0.0, verify_ms=ms, coord_ms=0.0, draft_len=1, num_draft_tokens=decoded,
        num_accepted_tokens=accepted, num_requests_with_draft_tokens=decoded,
        accepted_per_pos=(accepted,), drafted_per_pos=(decoded,), num_decoded_requests=decoded,
    )  # fmt: skip


def test_only_steps_at_the_cells_concurrency_are_counted() -> None:
    bench = load_benchmark("predict_cpu.py")
    stats = [
        step(30.0, 4, 0, new=4),  # the prefill step: never counted
        step(10.0, 4, 2),  # 6 tokens
        step(10.0, 4, 4),  # 8 tokens
        step(6.0, 2, 0),  # the tail: two requests left, 3 ms a token
        step(5.0, 1, 0),  # one left, 5 ms a token
    ]
    ms, accepted, drafted = bench.decode_ms_per_token(stats, 4)
    assert ms == pytest.approx(20.0 / 14)
    assert (accepted, drafted) == ([6], [8])
    # Counting the tail as well would make this cell 28 % slower per token than it is at c=4.
    assert bench.decode_ms_per_token(stats, 2)[0] == pytest.approx(3.0)


def test_a_run_with_no_step_at_the_concurrency_is_an_error_not_a_figure() -> None:
    bench = load_benchmark("predict_cpu.py")
    with pytest.raises(ValueError, match="no decode step carried all 4 sequences"):
        bench.decode_ms_per_token([step(5.0, 1, 0)], 4)


def test_each_speculative_run_is_judged_against_the_baselines_on_both_sides() -> None:
    bench = load_benchmark("predict_cpu.py")
    # the machine slows steadily (baselines 10, 12, 14 ms); each run against the baseline
    # before it reads 1.10 and 1.08 where speculation costs nothing; the bracket reads 1.0
    ratios = bench.bracketed_ratios([11.0, 13.0], [10.0, 12.0, 14.0])
    assert ratios == pytest.approx([1.0, 1.0])
    with pytest.raises(ValueError, match="one baseline run before each"):
        bench.bracketed_ratios([11.0, 13.0], [10.0, 12.0])
