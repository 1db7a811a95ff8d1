"""benchmarks/sustained_load.py: pooled time per output token, per wave, and the summary."""

from __future__ import annotations

import math

import pytest
from bench_support import load_benchmark

from spectool.decide.latency import RequestRecord

sustained = load_benchmark("sustained_load.py")


def record(name: str, send: float, first: float, end: float, tokens: int, error=None):  # noqa: ANN001, ANN201
    return RequestRecord(
        request_id=name,
        category="t",
        send_time_s=send,
        first_token_time_s=first,
        chunk_times_s=(first, end),
        chunk_token_counts=(1, tokens - 1),
        end_time_s=end,
        prompt_tokens=4,
        output_tokens=tokens,
        error=error,
    )


def test_pooled_tpot_is_decode_time_over_decode_tokens_of_good_requests() -> None:
    a = record("a", 0.0, 0.1, 1.1, 11)  # 1.0 s over 10 decode tokens
    b = record("b", 0.0, 0.2, 0.5, 4)  # 0.3 s over 3
    failed = record("c", 0.0, 0.1, 9.0, 11, error="HTTP 500")
    assert math.isclose(sustained.pooled_tpot([a, b, failed]), 1.3 / 13)
    with pytest.raises(ValueError, match="no decode tokens"):
        sustained.pooled_tpot([failed])


def test_waves_follow_the_send_order() -> None:
    # concurrency 2: the first wave is the two sent first, whatever order they are listed in
    late = [record("x", 2.0, 2.1, 2.5, 5), record("y", 2.1, 2.2, 3.0, 5)]  # 0.4/4, 0.8/4
    early = [record("p", 0.0, 0.1, 1.1, 5), record("q", 0.1, 0.2, 0.6, 5)]  # 1.0/4, 0.4/4
    waves = sustained.by_wave([*late, *early], 2)
    assert [round(w, 4) for w in waves] == [round(1.4 / 8, 4), round(1.2 / 8, 4)]


def test_summary_is_a_geometric_mean_with_two_standard_errors() -> None:
    s = sustained.summarize([0.9, 1.1, 1.0, 1.0], [2.0, 4.0])
    logs = [math.log(x) for x in (0.9, 1.1, 1.0, 1.0)]
    mean, sd = sum(logs) / 4, math.sqrt(sum((x - sum(logs) / 4) ** 2 for x in logs) / 3)
    assert math.isclose(s["ratio"], math.exp(mean))
    assert math.isclose(s["high"], math.exp(mean + 2 * sd / 2))
    assert s["low"] < s["ratio"] < s["high"] and s["block_s"] == 3.0 and s["n"] == 4
