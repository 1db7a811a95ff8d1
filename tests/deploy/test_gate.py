"""The cost gate and decision parsing: pure functions, every branch with measured numbers."""

from __future__ import annotations

import pytest
from deploy_helpers import decision_json

from spectool.deploy.decision import parse_decision
from spectool.deploy.gate import RuntimeGate, decide_speculation
from spectool.errors import BadInputError

# Speculation pays up to concurrency 8 (k=4 at 1-4, k=2 at 5-8), not at 32.
SCHEDULE = {1: 4, 4: 4, 8: 2, 32: 0}


def _decision(schedule: dict[int, int] = SCHEDULE):
    return parse_decision(decision_json(schedule), "decision.json")


def test_decision_reads_tune_output_and_applies_the_bucket_rule() -> None:
    d = _decision()
    assert d.concurrencies == (1, 4, 8, 32)
    assert [d.choice_at(c) for c in (1, 3, 4, 5, 8, 9, 32, 33)] == [4, 4, 4, 2, 2, 0, 0, 0]
    assert d.off_above == 8 and d.gate() is None
    assert d.draft_len_schedule("from") == {1: 4, 5: 2, 9: 0}
    assert d.draft_len_schedule("up_to") == {4: 4, 8: 2}
    cut = _decision({1: 3, 16: 3, 64: 0})
    assert cut.gate() is not None and (cut.gate().max_draft_len, cut.gate().max_concurrency) == (
        3,
        16,
    )


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.update(schedule={"1": 2, "8": 4}, max_draft_len=2), "larger draft length"),
        (lambda d: d.update(max_draft_len=3), "max_draft_len 3"),
        (lambda d: d.update(schedule={}), "schedule is empty"),
        (lambda d: d["cells"][0].update(verdict="maybe"), "cells.0.verdict"),
        (lambda d: d.pop("method"), "method"),
    ],
)
def test_bad_decisions_are_refused_naming_the_problem(mutate, needle: str) -> None:
    data = decision_json(SCHEDULE)
    mutate(data)
    with pytest.raises(BadInputError, match=needle) as exc:
        parse_decision(data, "d.json")
    assert exc.value.where == "d.json"


def test_no_decision_serves_as_built_with_a_warning() -> None:
    gate = decide_speculation("auto", None)
    assert gate.speculate and gate.warn and "unmeasured" in gate.reason


def test_pays_at_the_expected_concurrency_quotes_the_cell() -> None:
    gate = decide_speculation("auto", _decision(), expected_concurrency=3)
    assert gate.speculate and not gate.warn
    # 3 falls in the bucket of the measured concurrency 4 (k=4).
    assert "k=4 at concurrency 4" in gate.reason and "ratio 0.600" in gate.reason


def test_does_not_pay_under_load_without_a_runtime_gate_serves_baseline() -> None:
    gate = decide_speculation("auto", _decision(), expected_concurrency=20)
    assert not gate.speculate
    assert "does not pay at the expected concurrency 20" in gate.reason
    assert "11.50 ms/token vs 10.00 without speculation (ratio 1.150" in gate.reason
    assert "serving the baseline" in gate.reason


def test_runtime_gate_that_switches_off_under_load_keeps_speculation_on() -> None:
    runtime = RuntimeGate("draft_len_schedule", off_above=8)
    gate = decide_speculation("auto", _decision(), expected_concurrency=20, runtime_gate=runtime)
    assert gate.speculate and "turns it off above batch size 8" in gate.reason
    # A gate that would still speculate at the expected load does not count.
    late = RuntimeGate("max_concurrency", off_above=64)
    assert not decide_speculation(
        "auto", _decision(), expected_concurrency=20, runtime_gate=late
    ).speculate


def test_no_expected_concurrency_assumes_the_largest_measured() -> None:
    gate = decide_speculation("auto", _decision())
    assert not gate.speculate and "largest measured concurrency, 32" in gate.reason
    always = _decision({1: 4, 16: 2})
    assert decide_speculation("auto", always).speculate


def test_beyond_the_measured_range_is_not_assumed_to_pay() -> None:
    gate = decide_speculation("auto", _decision({1: 4, 16: 2}), expected_concurrency=64)
    assert not gate.speculate and "not measured" in gate.reason and "16" in gate.reason


def test_decision_that_never_pays_serves_baseline_whatever_the_load() -> None:
    never = _decision({1: 0, 8: 0})
    for c in (None, 1):
        gate = decide_speculation("auto", never, expected_concurrency=c)
        assert (
            not gate.speculate and "no measured concurrency where speculation pays" in gate.reason
        )
        assert "ratio 1.150" in gate.reason


def test_forced_modes() -> None:
    assert not decide_speculation("off", _decision(), expected_concurrency=1).speculate
    forced = decide_speculation("on", _decision(), expected_concurrency=20)
    assert forced.speculate and forced.warn and "does not pay" in forced.reason
    assert not decide_speculation("on", _decision(), expected_concurrency=1).warn
    with pytest.raises(BadInputError, match="--speculation"):
        decide_speculation("maybe", None)
    with pytest.raises(BadInputError, match="--expected-concurrency"):
        decide_speculation("auto", None, expected_concurrency=0)


def _rate(rate: float, ratio: float, low: float, high: float, verdict: str, flight: float):
    return {
        "rate_per_s": rate,
        "objective_ratio": ratio,
        "ci_low": low,
        "ci_high": high,
        "verdict": verdict,
        "in_flight_base": flight,
        "in_flight_spec": flight * ratio,
    }


def _with_rates():
    """Measured by tune --request-rate: pays at 2 req/s, not proven at 4, slower at 8."""
    data = decision_json(SCHEDULE)
    data["rates"] = [
        _rate(2.0, 0.6, 0.5, 0.7, "pays", 1.5),
        _rate(4.0, 0.95, 0.85, 1.05, "inconclusive", 4.0),
        _rate(8.0, 1.2, 1.1, 1.3, "does_not_pay", 12.0),
        {**_rate(3.0, 0.9, 0.8, 1.0, "inconclusive", 3.0), "trace": True},
    ]
    data["rates_objective"] = "tpot"
    return parse_decision(data, "decision.json")


def test_the_measured_rate_level_at_or_above_the_expected_rate_decides() -> None:
    d = _with_rates()
    pays = decide_speculation("auto", d, expected_rate=1.0)
    assert pays.speculate and "2 req/s" in pays.reason and "tpot 0.600" in pays.reason
    unproven = decide_speculation("auto", d, expected_rate=3.5)
    assert unproven.speculate and "not proven" in unproven.reason
    slower = decide_speculation("auto", d, expected_rate=6.0)
    assert not slower.speculate and "does not pay" in slower.reason and "8 req/s" in slower.reason
    # the concurrency cells alone would have speculated there (k=4 up to concurrency 4)
    assert decide_speculation("auto", d, expected_concurrency=4).speculate


def test_a_rate_above_every_level_maps_to_a_concurrency_by_littles_law() -> None:
    gate = decide_speculation("auto", _with_rates(), expected_rate=16.0)
    # 12 in flight at 8 req/s: at 16 req/s at least 24, beyond every measured concurrency
    assert "concurrency 24" in gate.reason and not gate.speculate


def test_a_rate_without_measured_levels_is_refused() -> None:
    with pytest.raises(BadInputError, match="--request-rate"):
        decide_speculation("auto", _decision(), expected_rate=2.0)
    with pytest.raises(BadInputError, match="not both"):
        decide_speculation("auto", _with_rates(), expected_rate=2.0, expected_concurrency=2)
    with pytest.raises(BadInputError, match="> 0"):
        decide_speculation("auto", _with_rates(), expected_rate=0.0)
