"""Latency metrics: TPOT from token counts, per-token ITL, percentiles, goodput, throughput."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectool.decide.latency import Distribution, RequestRecord, is_good, summarize
from spectool.errors import BadInputError


def record(
    rid: str = "r",
    *,
    send: float = 0.0,
    chunks: tuple[tuple[float, int], ...] = ((0.1, 1),),
    end: float | None = None,
    output_tokens: int | None = None,
    category: str = "chat",
    error: str | None = None,
    queue_wait_s: float | None = None,
    prompt_tokens: int = 10,
) -> RequestRecord:
    times = tuple(t for t, _ in chunks)
    counts = tuple(n for _, n in chunks)
    first = next((t for t, n in chunks if n > 0), None)
    return RequestRecord(
        request_id=rid,
        category=category,
        send_time_s=send,
        first_token_time_s=first,
        chunk_times_s=times,
        chunk_token_counts=counts,
        end_time_s=times[-1] if end is None else end,
        prompt_tokens=prompt_tokens,
        output_tokens=sum(counts) if output_tokens is None else output_tokens,
        error=error,
        queue_wait_s=queue_wait_s,
    )


def test_tpot_counts_tokens_not_chunks_with_multi_token_chunks() -> None:
    # First token at 100 ms, then two chunks of 3 speculated tokens each, 30 ms apart.
    r = record(chunks=((0.100, 1), (0.130, 3), (0.160, 3)))
    assert r.ttft_s == pytest.approx(0.100)
    assert r.e2e_s == pytest.approx(0.160)
    assert r.tpot_s == pytest.approx(0.060 / 6)  # 10 ms per token
    assert r.inter_chunk_s == pytest.approx((0.030, 0.030))  # chunk gaps are 3x the TPOT
    assert r.itl_s == pytest.approx((0.010,) * 6)  # each gap divided over its 3 tokens
    assert r.output_tokens_per_s_per_user == pytest.approx(100.0)


def test_zero_token_chunks_fold_into_the_next_gap() -> None:
    r = record(chunks=((0.05, 0), (0.10, 1), (0.12, 0), (0.14, 2)), output_tokens=3)
    assert r.ttft_s == pytest.approx(0.10)
    assert r.inter_chunk_s == pytest.approx((0.04,))
    assert r.itl_s == pytest.approx((0.02, 0.02))


def test_tpot_undefined_below_two_tokens() -> None:
    assert record(chunks=((0.1, 1),)).tpot_s is None
    assert record(chunks=((0.1, 1),)).output_tokens_per_s_per_user is None


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.floats(0.001, 0.5), min_size=1, max_size=20),
    counts=st.lists(st.integers(1, 8), min_size=21, max_size=21),
    ttft=st.floats(0.001, 2.0),
)
def test_itl_mean_is_decode_time_over_decode_tokens(
    gaps: list[float], counts: list[int], ttft: float
) -> None:
    times = np.concatenate([[ttft], ttft + np.cumsum(gaps)])
    n = [1] + counts[: len(gaps)]  # the first chunk carries the first token
    r = record(chunks=tuple(zip(times.tolist(), n, strict=True)))
    itl = np.array(r.itl_s)
    assert itl.size == sum(n[1:])
    assert itl.mean() == pytest.approx((times[-1] - times[0]) / sum(n[1:]))
    # With one token first and the request ending at its last chunk, TPOT is the mean ITL.
    assert r.tpot_s == pytest.approx(itl.mean())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=200))
def test_distribution_matches_numpy(values: list[float]) -> None:
    d = Distribution.of(values)
    assert d is not None
    arr = np.array(values)
    assert d.count == arr.size
    assert d.mean == pytest.approx(arr.mean(), abs=1e-6)
    assert d.std == pytest.approx(arr.std(), abs=1e-6)
    for q, got in ((50, d.p50), (90, d.p90), (99, d.p99)):
        assert got == pytest.approx(np.percentile(arr, q), abs=1e-6)
    assert (d.min, d.max) == (arr.min(), arr.max())


def test_empty_distribution_is_none() -> None:
    assert Distribution.of([]) is None


def test_summary_percentiles_and_throughput_against_numpy() -> None:
    rng = np.random.default_rng(7)
    records = []
    for i in range(50):
        ttft = float(rng.uniform(0.05, 0.5))
        gaps = rng.uniform(0.01, 0.05, size=int(rng.integers(3, 12)))
        counts = rng.integers(1, 4, size=gaps.size)
        times = ttft + np.concatenate([[0.0], np.cumsum(gaps)])
        chunks = tuple(zip(times.tolist(), [1, *counts.tolist()], strict=True))
        records.append(record(f"r{i}", chunks=chunks, category="a" if i % 3 else "b"))
    s = summarize(records, duration_s=20.0)
    ttfts = np.array([r.ttft_s for r in records])
    tpots = np.array([r.tpot_s for r in records])
    e2es = np.array([r.e2e_s for r in records])
    for dist, arr in ((s.ttft_s, ttfts), (s.tpot_s, tpots), (s.e2e_s, e2es)):
        assert dist is not None
        assert dist.p50 == pytest.approx(np.percentile(arr, 50))
        assert dist.p90 == pytest.approx(np.percentile(arr, 90))
        assert dist.p99 == pytest.approx(np.percentile(arr, 99))
        assert dist.mean == pytest.approx(arr.mean())
    all_itl = np.concatenate([r.itl_s for r in records])
    assert s.itl_s is not None
    assert s.itl_s.p99 == pytest.approx(np.percentile(all_itl, 99))
    assert s.itl_s.count == sum(r.output_tokens - 1 for r in records)
    out = sum(r.output_tokens for r in records)
    assert s.output_tokens_per_s == pytest.approx(out / 20.0)
    assert s.total_tokens_per_s == pytest.approx((out + 10 * 50) / 20.0)
    assert s.requests_per_s == pytest.approx(50 / 20.0)
    assert s.queue_wait_s is None  # never reported
    assert s.good_requests is None
    assert s.goodput_requests_per_s is None
    assert set(s.by_category) == {"a", "b"}
    assert sum(c.completed for c in s.by_category.values()) == 50
    assert sum(c.output_tokens_per_s for c in s.by_category.values()) == pytest.approx(
        s.output_tokens_per_s
    )
    b_ttfts = np.array([r.ttft_s for r in records if r.category == "b"])
    assert s.by_category["b"].ttft_s is not None
    assert s.by_category["b"].ttft_s.p90 == pytest.approx(np.percentile(b_ttfts, 90))


def test_errors_are_counted_and_excluded() -> None:
    ok = record("ok", chunks=((0.1, 1), (0.2, 1)), queue_wait_s=0.02)
    bad = record("bad", chunks=((5.0, 1), (9.0, 1)), error="HTTP 500", queue_wait_s=4.0)
    s = summarize([ok, bad], duration_s=10.0)
    assert (s.requests, s.completed, s.errors) == (2, 1, 1)
    assert s.ttft_s is not None
    assert s.ttft_s.max == pytest.approx(0.1)
    assert s.queue_wait_s is not None
    assert s.queue_wait_s.mean == pytest.approx(0.02)
    assert s.total_output_tokens == 2


def test_goodput_follows_vllm() -> None:
    # TTFT 100 ms, TPOT 10 ms: exactly on both SLOs, which counts as good (value <= slo).
    on_slo = record("on", chunks=((0.100, 1), (0.110, 1), (0.120, 1)))
    slow_tpot = record("slow", chunks=((0.100, 1), (0.150, 1)))  # TPOT 50 ms
    slow_ttft = record("late", chunks=((0.300, 1), (0.301, 1)))  # TTFT 300 ms
    one_token = record("one", chunks=((0.050, 1),))  # TPOT counts as 0 for goodput
    failed = record("err", chunks=((0.010, 1), (0.011, 1)), error="timeout")
    records = [on_slo, slow_tpot, slow_ttft, one_token, failed]
    s = summarize(records, duration_s=4.0, slo_ttft_ms=100.0, slo_tpot_ms=10.0)
    assert s.good_requests == 2
    assert s.goodput_requests_per_s == pytest.approx(2 / 4.0)
    only_ttft = summarize(records, duration_s=4.0, slo_ttft_ms=100.0)
    assert only_ttft.good_requests == 3
    e2e = summarize(records, duration_s=4.0, slo_e2e_ms=120.0)
    assert e2e.good_requests == 2  # on_slo (120 ms) and one_token (50 ms)
    assert not is_good(failed)


def test_goodput_without_first_token_fails_ttft_slo() -> None:
    r = RequestRecord("x", "c", 0.0, None, (), (), 1.0, 5, 0)
    assert not is_good(r, slo_ttft_ms=1e9)
    assert is_good(r, slo_e2e_ms=1e9)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"chunk_token_counts": (1,)}, "chunk token counts"),
        ({"chunk_times_s": (0.2, 0.1), "chunk_token_counts": (1, 1)}, "arrival order"),
        ({"end_time_s": -1.0}, "before send_time_s"),
        ({"chunk_times_s": (2.0,), "chunk_token_counts": (1,)}, "outside"),
        ({"queue_wait_s": -0.1}, "negative"),
    ],
)
def test_bad_records_are_rejected(kwargs: dict, problem: str) -> None:
    base = {
        "request_id": "bad",
        "category": "c",
        "send_time_s": 0.0,
        "first_token_time_s": 0.1,
        "chunk_times_s": (0.1, 0.2),
        "chunk_token_counts": (1, 1),
        "end_time_s": 1.0,
        "prompt_tokens": 3,
        "output_tokens": 2,
    }
    with pytest.raises(BadInputError, match=problem) as exc:
        RequestRecord(**{**base, **kwargs})
    assert "bad" in str(exc.value)


def test_bad_duration_and_slo_are_rejected() -> None:
    with pytest.raises(BadInputError, match="duration_s"):
        summarize([record()], duration_s=0.0)
    with pytest.raises(BadInputError, match="SLO"):
        summarize([record()], duration_s=1.0, slo_tpot_ms=-1.0)


def test_lists_are_frozen_into_tuples() -> None:
    r = RequestRecord("x", "c", 0.0, 0.1, [0.1, 0.2], [1, 2], 0.2, 1, 3)  # type: ignore[arg-type]
    assert r.chunk_times_s == (0.1, 0.2)
    assert r.chunk_token_counts == (1, 2)
    assert math.isclose(r.tpot_s or 0.0, 0.05)
