"""SLO terms and whether a run met them: parsing, percentiles, and keeping pace."""

from __future__ import annotations

import pytest

from spectool.decide.latency import RequestRecord
from spectool.decide.slo import SloTerm, kept_up, meets, observed_ms, parse_slo
from spectool.errors import BadInputError


def _req(i: int, send: float, ttft: float, tpot: float, n: int = 5) -> RequestRecord:
    first = send + ttft
    chunks = tuple(first + tpot * j for j in range(n))
    return RequestRecord(f"r{i}", "c", send, first, chunks, (1,) * n, chunks[-1], 10, n)


def test_terms_parse_with_units_and_percentiles() -> None:
    terms = parse_slo("ttft:200ms, tpot:30@p90,e2e:2s")
    assert terms == (
        SloTerm("ttft", 200.0, 99.0),
        SloTerm("tpot", 30.0, 90.0),
        SloTerm("e2e", 2000.0, 99.0),
    )
    assert parse_slo(None) == () and parse_slo(" ") == ()
    for bad in ("itl:30ms", "tpot:", "tpot:30ms@p0", "tpot:0", "tpot:3,tpot:4", "tpot=30"):
        with pytest.raises(BadInputError, match="--slo"):
            parse_slo(bad)


def test_a_run_meets_the_slo_by_its_percentile() -> None:
    # 10 requests, 0.1 s apart; TPOT 10 ms for nine, 50 ms for one
    records = [_req(i, 0.1 * i, 0.02, 0.050 if i == 9 else 0.010) for i in range(10)]
    p50 = SloTerm("tpot", 20.0, 50.0)
    p99 = SloTerm("tpot", 20.0, 99.0)
    assert observed_ms(records, p50) == pytest.approx(10.0)
    assert observed_ms(records, p99) > 40.0
    assert meets(records, [p50])[0] and not meets(records, [p99])[0]
    assert not meets(records, [p50, SloTerm("ttft", 10.0, 50.0)])[0]  # TTFT 20 ms


def test_a_server_falling_behind_never_meets_the_slo() -> None:
    steady = [_req(i, 0.1 * i, 0.02, 0.01) for i in range(10)]
    # each request waits for the one before: completions spread over twice the arrivals' span
    queued = [_req(i, 0.1 * i, 0.02 + 0.1 * i, 0.01) for i in range(10)]
    assert kept_up(steady) and not kept_up(queued)
    assert not meets(queued, [SloTerm("tpot", 1000.0)])[0]
