"""Goodput as tune's objective: requests per second that met every SLO limit (vLLM's
``--goodput``), paired per block like every other objective.

The records are built with known latencies (the decision logic, not a measurement); the
objective end to end on the embedded engine is in tests/tune/test_goodput_tune.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from spectool.decide.paired import BlockPair, PairedCell, paired_estimate
from spectool.decide.slo import good_requests, goodput_terms, parse_slo, resolve_objective
from spectool.decide.verdict import objective_source
from spectool.errors import BadInputError

from .test_paired import _requests_block as _block

SLO = parse_slo("tpot:12ms")


def test_a_request_is_good_only_when_it_meets_every_limit() -> None:
    block = _block(0, [0.010, 0.011, 0.013, 0.030])
    assert good_requests(block.records, SLO).tolist() == [1.0, 1.0, 0.0, 0.0]
    both = parse_slo("tpot:12ms,ttft:10ms")  # every first token took 20 ms
    assert good_requests(block.records, both).tolist() == [0.0] * 4
    num, den = goodput_terms(block.records, SLO)
    span_ms = (block.records[-1].end_time_s - block.records[0].send_time_s) * 1000.0
    assert num.sum() == pytest.approx(span_ms) and den.sum() == pytest.approx(2.5)
    num, den = goodput_terms(block.records, both)  # none good: finite, not undefined
    assert np.isfinite(num.sum() / den.sum()) and den.sum() == pytest.approx(0.5)


def test_goodput_sees_what_the_mean_tpot_hides() -> None:
    """Speculation halves TPOT for 7 requests in 10 and slows 3 past the limit: the mean TPOT
    pays, the goodput (7 good against 10, in a longer block) is proven lower."""
    rng = np.random.default_rng(3)
    pairs = []
    for i in range(8):
        base = [0.010 * (1 + 0.03 * rng.standard_normal()) for _ in range(10)]
        spec = [0.005 * (1 + 0.03 * rng.standard_normal()) for _ in range(7)] + [0.014] * 3
        pairs.append(BlockPair(_block(3, spec, i), _block(0, base, i)))
    objective = resolve_objective("goodput", SLO)
    assert objective == "goodput:tpot:12ms"
    tpot = paired_estimate(PairedCell(tuple(pairs), objective="tpot"))
    good = paired_estimate(PairedCell(tuple(pairs), objective=objective))
    assert tpot.verdict == "pays"
    assert good.verdict == "does_not_pay" and good.ratio > 1.3  # wall time per good request
    assert good.source == objective


def test_goodput_pays_where_only_speculation_meets_the_slo() -> None:
    pairs = [
        BlockPair(_block(2, [0.008] * 10, i), _block(0, [0.010 + 0.0005 * (i % 3)] * 10, i))
        for i in range(6)
    ]
    tight = resolve_objective("goodput", parse_slo("tpot:9ms"))
    estimate = paired_estimate(PairedCell(tuple(pairs), objective=tight))
    assert estimate.verdict == "pays" and estimate.ratio < 0.1


def test_goodput_needs_an_slo_and_names_the_flag() -> None:
    with pytest.raises(BadInputError, match="--objective.*--slo"):
        resolve_objective("goodput", ())
    assert resolve_objective("tpot", SLO) == "tpot"
    with pytest.raises(BadInputError, match="--objective"):
        objective_source("goodput")  # bare: it was never resolved against an SLO
    with pytest.raises(BadInputError, match="--objective"):
        objective_source("fastest")
