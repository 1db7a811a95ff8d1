"""What the predictions compare with: the paired cells' own baselines, and the prefill stall a
user's time per token holds beside the engine's steps (spectool.decide.search.prediction_baselines)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from spectool.decide.acceptance import expected_tokens_per_step
from spectool.decide.cell import CellMeasurement, IterationSample
from spectool.decide.latency import RequestRecord
from spectool.decide.model import TERMS, fit_step_cost, predict_cell
from spectool.decide.paired import BlockPair, PairedCell
from spectool.decide.search import prediction_baselines, stall_ms
from spectool.decide.tune import tune
from spectool.errors import BadInputError

from .test_model import exact_observations
from .world import World


def cell(c: int, step: float, tpot: float | None = None, *, steps: int = 20) -> CellMeasurement:
    """A baseline cell whose steps take ``step`` ms at batch ``c`` and whose requests (when
    ``tpot`` is given) spend ``tpot`` ms per decode token."""
    iterations = tuple(IterationSample(0.0, step, 0.0, c, c) for _ in range(steps))
    records = ()
    if tpot is not None:
        out = 11
        records = tuple(
            RequestRecord(
                request_id=f"r{i}",
                category="chat",
                send_time_s=float(i),
                first_token_time_s=i + 0.1,
                chunk_times_s=(i + 0.1, i + 0.1 + tpot * (out - 1) / 1000.0),
                chunk_token_counts=(1, out - 1),
                end_time_s=i + 0.1 + tpot * (out - 1) / 1000.0,
                prompt_tokens=50,
                output_tokens=out,
            )
            for i in range(4)
        )
    return CellMeasurement(concurrency=c, k=0, records=records, iterations=iterations)


def test_the_stall_is_a_users_time_per_token_beyond_the_engines_step() -> None:
    assert stall_ms(cell(4, 2.0, 5.0)) == pytest.approx(3.0)
    assert stall_ms(cell(4, 2.0)) == 0.0  # no requests: nothing to tell
    assert stall_ms(cell(4, 6.0, 5.0)) == 0.0  # never below 0
    no_steps = replace(cell(4, 2.0, 5.0), iterations=())
    assert stall_ms(no_steps) == 0.0  # no steps: the time per token is all there is


def test_a_stall_sits_on_both_sides_of_the_predicted_ratio() -> None:
    """The stall is the same with speculation as without: it pulls the ratio towards 1 by the
    share of a user's time per token it holds (0: the step ratio, as before)."""
    model = fit_step_cost(
        exact_observations(dict(zip(TERMS, (15.0, 0.3, 1.5, 0.5, 1.0), strict=True)))
    )
    alphas = (0.8, 0.6, 0.4)
    steps_only = predict_cell(model, 8, 2, alphas, base_step_ms=20.0)
    stalled = predict_cell(model, 8, 2, alphas, base_step_ms=20.0, stall_ms=30.0)
    tokens = expected_tokens_per_step(alphas, 2)
    assert stalled.ratio == pytest.approx((steps_only.step_ms / tokens + 30.0) / 50.0)
    assert stalled.ratio == pytest.approx(steps_only.ratio * 0.4 + 0.6)  # 60 % of it stall
    assert stalled.ms_per_token == pytest.approx(steps_only.ms_per_token + 30.0)
    assert abs(1 - stalled.ratio) < abs(1 - steps_only.ratio)
    with pytest.raises(BadInputError):
        predict_cell(model, 8, 2, alphas, base_step_ms=20.0, stall_ms=-1.0)


def test_the_pairs_baselines_win_and_scale_the_concurrencies_without_pairs() -> None:
    planning = {1: cell(1, 2.0, 2.2), 4: cell(4, 3.0, 8.0), 16: cell(16, 8.0, 30.0)}
    paired = {1: cell(1, 2.5, 2.6), 16: cell(16, 10.0, 36.0)}
    got = prediction_baselines(planning, paired, stalls=True)
    assert got.paired == (1, 16)
    assert got.scale == pytest.approx(1.25)  # sqrt(2.5 / 2.0 * 10.0 / 8.0)
    assert got.step_ms == pytest.approx({1: 2.5, 4: 3.75, 16: 10.0})
    assert got.stall_ms == pytest.approx({1: 0.1, 4: 5.0 * 1.25, 16: 26.0})
    assert got.batch == {1: 1.0, 4: 4.0, 16: 16.0}
    observed = sorted((o.batch, o.k, o.step_ms) for o in got.observations)
    assert [(b, k) for b, k, _ in observed] == [(1.0, 0), (4.0, 0), (16.0, 0)]
    assert [s for *_, s in observed] == pytest.approx([2.5, 3.75, 10.0])
    plain = prediction_baselines(planning, {}, stalls=False)
    assert plain.scale == 1.0 and plain.step_ms == {1: 2.0, 4: 3.0, 16: 8.0}
    assert set(plain.stall_ms.values()) == {0.0}


def test_a_planning_baseline_from_other_minutes_no_longer_skews_the_predictions() -> None:
    """The machine ran 30 % slower while the plan's pairs were measured than during the planning
    baseline: the speculative steps the model fits are the slow machine's. Taken against the
    planning baseline (before 2026-12-05) every predicted ratio came out 30 % too pessimistic;
    against the pairs' own baselines the prediction of a planned cell is its measured step
    ratio."""
    fast, slow = World(), World(fixed_ms=15.0 * 1.3, per_request_ms=0.3 * 1.3)
    concs, k_max = (1, 4, 16), 4

    def measure(c: int, k: int) -> CellMeasurement | PairedCell:
        if k == 0:
            return fast.measure(c, 0)
        seeds = range(8)
        return PairedCell(
            tuple(
                BlockPair(
                    replace(slow, seed=s).measure(c, k), replace(slow, seed=100 + s).measure(c, 0)
                )
                for s in seeds
            )
        )

    result = tune(concs, k_max, measure, n_boot=50, objective="steps")
    by = {(p.concurrency, p.k): p.ratio for p in result.predictions}
    for c in (1, 16):
        assert by[(c, k_max)] == pytest.approx(slow.true_ratio(c, k_max), rel=0.03)
        taken_against_planning = slow.step_ms(c, k_max) / (
            expected_tokens_per_step(slow.alphas, k_max) * fast.step_ms(c, 0)
        )
        assert math.log(taken_against_planning / slow.true_ratio(c, k_max)) > 0.2
