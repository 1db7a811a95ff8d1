"""The smallest concurrency's choice gates the schedule: an inconclusive cell there may be kept.

A TensorRT-LLM ``draft_len_schedule`` starts with ``max_draft_len`` at the smallest batch, so
"off at concurrency 1, on from 2" cannot be written. When nothing pays at the smallest
concurrency but a cell there is inconclusive (its interval straddles 1) while larger
concurrencies pay, refusing it would switch speculation off everywhere; it is weighed like any
writable set (sum of ratios, off = 1) and kept, with a note, when it wins and enables a paying
cell elsewhere. A cell that does not pay there is never kept. An inconclusive cell whose estimate
beats off is eligible in its own right (*uncertain*, issue 21), unless its interval proves a tie
with off (within 1 +- the tie margin).
"""

from __future__ import annotations

from spectool.decide.choose import final_choices
from spectool.decide.verdict import CellVerdict, Verdict


def cell(c: int, k: int, ratio: float, low: float, high: float, verdict: Verdict) -> CellVerdict:
    return CellVerdict(
        concurrency=c,
        k=k,
        lhs_ms_per_token=ratio,
        rhs_ms_per_token=1.0,
        ratio=ratio,
        ci_low=low,
        ci_high=high,
        verdict=verdict,
        source="iterations",
        confidence=0.95,
        n_boot=100,
        n_spec=100,
        n_base=100,
        tokens_per_step_measured=None,
        tokens_per_step_predicted=None,
        step_cost_ratio=None,
        predicted_speedup=None,
        measured_speedup=1.0 / ratio,
    )


def choose(verdicts: list[CellVerdict], concs: tuple[int, ...] = (1, 2, 4)) -> dict[int, int]:
    ranking = {(v.concurrency, v.k): v.ratio for v in verdicts}
    return final_choices(concs, verdicts, ranking, 0.0, False)


def test_inconclusive_first_cell_kept_when_it_enables_paying_cells() -> None:
    verdicts = [
        cell(1, 4, 0.91, 0.75, 1.12, "inconclusive"),
        cell(2, 4, 0.70, 0.61, 0.83, "pays"),
        cell(4, 3, 0.68, 0.58, 0.80, "pays"),
        cell(4, 4, 0.73, 0.60, 0.90, "pays"),
    ]
    assert choose(verdicts) == {1: 4, 2: 4, 4: 3}


def test_a_first_cell_proven_tied_with_off_alone_is_not_chosen() -> None:
    verdicts = [
        cell(1, 4, 0.98, 0.955, 1.01, "inconclusive"),  # within 1 +- 5%: a proven tie
        cell(2, 4, 1.05, 0.95, 1.20, "inconclusive"),
        cell(4, 4, 1.30, 1.10, 1.50, "does_not_pay"),
    ]
    assert choose(verdicts) == {1: 0, 2: 0, 4: 0}
    assert verdicts[0].tie_with_off and verdicts[0].to_json()["tie_with_off"] is True
    # the same estimate with an interval too wide to prove the tie: deployed on its estimate
    verdicts[0] = cell(1, 4, 0.98, 0.80, 1.12, "inconclusive")
    assert choose(verdicts) == {1: 4, 2: 0, 4: 0}
    assert not verdicts[0].tie_with_off and verdicts[0].to_json()["tie_with_off"] is False
    assert not cell(1, 4, 0.97, 0.96, 0.99, "pays").tie_with_off  # a proven gain is no tie


def test_an_unproven_gain_is_deployed_on_its_estimate_unless_a_tie_is_proven() -> None:
    """Issue 21: where the budget ran out before the interval cleared 1, the better estimate
    is deployed (reported uncertain); only a tie with off proven within the margin is off."""
    from spectool.decide.choose import unproven_gain

    uncertain = cell(1, 4, 0.91, 0.75, 1.12, "inconclusive")
    verdicts = [uncertain, cell(2, 4, 0.93, 0.85, 1.02, "inconclusive")]
    verdicts += [cell(4, 4, 0.97, 0.96, 1.02, "inconclusive")]
    assert choose(verdicts) == {1: 4, 2: 4, 4: 0}
    assert unproven_gain(uncertain) and not unproven_gain(verdicts[2])
    # a gain within the margin whose tie is not proven (built-in, concurrency 4, a stop-53 run:
    # 0.952, 0.890-1.019; left off it reached 89% of the sweep's best, k=2 100%)
    close = cell(4, 2, 0.952, 0.890, 1.019, "inconclusive")
    assert unproven_gain(close)
    assert choose([*verdicts[:2], close]) == {1: 4, 2: 4, 4: 2}
    assert not unproven_gain(cell(4, 2, 1.01, 0.9, 1.1, "inconclusive"))  # no gain estimated
    assert not unproven_gain(uncertain, min_gain=0.10)  # --min-gain raises the bar
    assert not unproven_gain(cell(1, 4, 0.7, 0.6, 0.8, "pays"))  # proven: not uncertain


def test_undecided_first_cell_weighed_against_the_gains_it_enables() -> None:
    # Maybe 7% slower at concurrency 1 (undecided), 30% faster at 2, 4, 8: k=4 everywhere wins.
    verdicts = [cell(1, 4, 1.07, 0.92, 1.27, "inconclusive")]
    verdicts += [cell(c, 4, 0.7, 0.6, 0.8, "pays") for c in (2, 4, 8)]
    assert choose(verdicts, (1, 2, 4, 8)) == {1: 4, 2: 4, 4: 4, 8: 4}
    # A 20% cost there against a 10% gain at one concurrency: off is better.
    costly = [cell(1, 4, 1.2, 0.98, 1.4, "inconclusive"), cell(2, 4, 0.9, 0.85, 0.95, "pays")]
    assert choose(costly, (1, 2)) == {1: 0, 2: 0}


def test_a_first_cell_that_does_not_pay_is_never_kept() -> None:
    worse = [cell(1, 4, 1.3, 1.1, 1.5, "does_not_pay"), cell(2, 4, 0.5, 0.4, 0.6, "pays")]
    assert choose(worse, (1, 2)) == {1: 0, 2: 0}


def test_a_paying_first_cell_still_wins_over_an_inconclusive_one() -> None:
    verdicts = [
        cell(1, 2, 0.80, 0.70, 0.90, "pays"),
        cell(1, 4, 0.79, 0.55, 1.05, "inconclusive"),
        cell(2, 2, 0.85, 0.75, 0.95, "pays"),
        cell(2, 4, 0.97, 0.85, 1.04, "inconclusive"),
    ]
    # k1 = 4 (uncertain) totals 0.79 + 0.85 against 0.80 + 0.85 for k1 = 2 (pays): the better
    # estimate wins at the first concurrency (a tie there between k's is not proven)
    assert choose(verdicts, (1, 2)) == {1: 4, 2: 2}
    # a worse estimate than the paying cell's lets concurrency 2 do no better, so the cell
    # that pays is kept
    verdicts[1] = cell(1, 4, 0.96, 0.55, 1.05, "inconclusive")
    assert choose(verdicts, (1, 2)) == {1: 2, 2: 2}


def test_an_undecided_first_cell_may_lift_a_cap_set_by_a_paying_one() -> None:
    # k=1 pays at concurrency 1; k=4 there is undecided; concurrencies 2 and 4 pay far more at
    # k=4 than at k=1. The writable set under k1 = 1 wastes them.
    verdicts = [
        cell(1, 1, 0.91, 0.83, 0.99, "pays"),
        cell(1, 4, 0.98, 0.85, 1.12, "inconclusive"),
        cell(2, 1, 1.05, 0.95, 1.15, "inconclusive"),
        cell(2, 4, 0.70, 0.60, 0.80, "pays"),
        cell(4, 1, 0.95, 0.90, 0.99, "pays"),
        cell(4, 4, 0.65, 0.55, 0.75, "pays"),
    ]
    assert choose(verdicts) == {1: 4, 2: 4, 4: 4}
