"""The cost inequality per cell: both measurement paths, the bootstrap interval, the verdict."""

from __future__ import annotations

import numpy as np
import pytest

from spectool.decide.acceptance import PositionCounts
from spectool.decide.cell import CellMeasurement, IterationSample
from spectool.decide.cost import (
    bootstrap_ratio_ci,
    default_block_len,
    evaluate_cell,
)
from spectool.decide.latency import RequestRecord
from spectool.decide.verdict import verdict_for
from spectool.errors import BadInputError


def iters(step_ms: list[float], batch: list[int], confirmed: list[int]) -> tuple:
    return tuple(
        IterationSample(
            draft_ms=0.2 * s, verify_ms=0.7 * s, coord_ms=0.1 * s, batch_size=b, confirmed_tokens=c
        )
        for s, b, c in zip(step_ms, batch, confirmed, strict=True)
    )


def test_verdict_rule() -> None:
    assert verdict_for(0.7, 0.9) == "pays"
    assert verdict_for(1.1, 1.3) == "does_not_pay"
    assert verdict_for(0.9, 1.1) == "inconclusive"
    assert verdict_for(0.8, 1.0) == "inconclusive"  # touching 1 is not below it
    assert verdict_for(1.0, 1.2) == "inconclusive"


def test_iteration_path_formulas() -> None:
    # Spec: steps of 30 and 34 ms, batches 4 and 2, confirming 10 and 6 tokens.
    spec = CellMeasurement(4, 3, iterations=iters([30, 34], [4, 2], [10, 6]))
    # Baseline: 20 ms steps at batch 4 and 2 (one token each).
    base = CellMeasurement(4, 0, iterations=iters([20, 22], [4, 2], [4, 2]))
    v = evaluate_cell(spec, base, alphas=[0.8, 0.6, 0.4], n_boot=200)
    lhs = (4 * 30 + 2 * 34) / (10 + 6)
    rhs = (4 * 20 + 2 * 22) / (4 + 2)
    assert v.source == "iterations"
    assert v.lhs_ms_per_token == pytest.approx(lhs)
    assert v.rhs_ms_per_token == pytest.approx(rhs)
    assert v.ratio == pytest.approx(lhs / rhs)
    e_meas = 16 / 6
    assert v.tokens_per_step_measured == pytest.approx(e_meas)
    # c = t_step_spec / t_step_base with batch-weighted step times.
    c = ((4 * 30 + 2 * 34) / 6) / rhs
    assert v.step_cost_ratio == pytest.approx(c)
    e_pred = 1 + 0.8 + 0.8 * 0.6 + 0.8 * 0.6 * 0.4
    assert v.tokens_per_step_predicted == pytest.approx(e_pred)
    assert v.predicted_speedup == pytest.approx(e_pred / c)
    assert v.measured_speedup == pytest.approx(rhs / lhs)
    assert v.ci_low <= v.ratio <= v.ci_high
    assert set(v.to_json()) == set(
        "concurrency k lhs_ms_per_token rhs_ms_per_token ratio ci_low ci_high verdict "
        "tie_with_off design".split()
    )


def _req(rid: str, decode_s: float, out: int, ttft: float = 0.05) -> RequestRecord:
    # Chunks of 2 tokens after the first token, evenly spaced over the decode time.
    n_chunks = (out - 1) // 2
    times = ttft + decode_s * np.arange(1, n_chunks + 1) / n_chunks
    return RequestRecord(
        rid,
        "c",
        0.0,
        ttft,
        (ttft, *times.tolist()),
        (1,) + (2,) * n_chunks,
        ttft + decode_s,
        5,
        out,
    )


def test_request_path_is_token_weighted_tpot() -> None:
    spec_records = (_req("a", 0.10, 11), _req("b", 0.30, 21))  # 10 and 20 decode tokens
    base_records = (_req("c", 0.40, 21), _req("d", 0.60, 31))
    failed = RequestRecord("e", "c", 0.0, 0.1, (0.1,), (1,), 9.0, 5, 1, error="boom")
    spec = CellMeasurement(
        2, 2, records=spec_records + (failed,), positions=PositionCounts((60, 30), (100, 60))
    )
    base = CellMeasurement(2, 0, records=base_records)
    v = evaluate_cell(spec, base, n_boot=100)
    assert v.source == "requests"
    assert v.lhs_ms_per_token == pytest.approx(400.0 / 30)
    assert v.rhs_ms_per_token == pytest.approx(1000.0 / 50)
    assert (v.n_spec, v.n_base) == (2, 2)
    assert v.tokens_per_step_measured == pytest.approx(1 + 90 / 100)
    assert v.step_cost_ratio == pytest.approx(v.ratio * 1.9)
    assert v.tokens_per_step_predicted is None
    assert v.predicted_speedup is None


def _gamma_sample(rng: np.random.Generator, n: int, mean: float) -> tuple[np.ndarray, np.ndarray]:
    tokens = rng.integers(20, 200, size=n).astype(float)
    per_token = rng.gamma(shape=4.0, scale=mean / 4.0, size=n)
    return tokens * per_token, tokens


def test_bootstrap_interval_covers_the_true_ratio() -> None:
    """200 synthetic experiments with a known ratio: the 90% interval covers it ~90% of the time."""
    mu_spec, mu_base = 7.0, 10.0  # ms per token; population ratio 0.7
    hits = 0
    reps = 200
    for rep in range(reps):
        rng = np.random.default_rng([2024, rep])
        s_num, s_den = _gamma_sample(rng, 40, mu_spec)
        b_num, b_den = _gamma_sample(rng, 40, mu_base)
        _, lo, hi = bootstrap_ratio_ci(
            s_num, s_den, b_num, b_den, n_boot=200, confidence=0.90, rng=rng
        )
        hits += lo <= mu_spec / mu_base <= hi
    assert 0.82 <= hits / reps <= 0.97


def test_bootstrap_interval_narrows_with_more_data() -> None:
    rng = np.random.default_rng(3)
    widths = []
    for n in (20, 500):
        s = _gamma_sample(rng, n, 7.0)
        b = _gamma_sample(rng, n, 10.0)
        _, lo, hi = bootstrap_ratio_ci(*s, *b, n_boot=400, rng=rng)
        widths.append(hi - lo)
    assert widths[1] < widths[0] / 2


def test_identical_runs_are_inconclusive() -> None:
    rng = np.random.default_rng(0)
    num, den = _gamma_sample(rng, 60, 10.0)
    ratio, lo, hi = bootstrap_ratio_ci(num, den, num, den, n_boot=500, rng=rng)
    assert ratio == pytest.approx(1.0)
    assert lo < 1.0 < hi
    assert verdict_for(lo, hi) == "inconclusive"


def _iter_cell(
    c: int, k: int, step_ms: float, tokens_per_req: float, seed: int, n: int = 120
) -> CellMeasurement:
    rng = np.random.default_rng(seed)
    steps = step_ms * (1 + 0.05 * rng.standard_normal(n))
    confirmed = np.maximum(c, np.round(c * tokens_per_req + rng.normal(0, 0.5, n))).astype(int)
    if k == 0:
        confirmed[:] = c
    return CellMeasurement(c, k, iterations=iters(steps.tolist(), [c] * n, confirmed.tolist()))


@pytest.mark.parametrize(
    ("spec_step", "tokens", "expected"),
    [(24.0, 2.0, "pays"), (40.0, 1.5, "does_not_pay"), (30.0, 1.5, "inconclusive")],
)
def test_verdicts_from_iterations(spec_step: float, tokens: float, expected: str) -> None:
    base = _iter_cell(8, 0, 20.0, 1.0, seed=1)
    spec = _iter_cell(8, 2, spec_step, tokens, seed=2)
    v = evaluate_cell(spec, base, n_boot=500)
    assert v.verdict == expected
    assert v.ci_low <= v.ratio <= v.ci_high


def test_seeded_and_order_independent() -> None:
    base = _iter_cell(4, 0, 20.0, 1.0, seed=1)
    spec = _iter_cell(4, 3, 26.0, 2.0, seed=2)
    a = evaluate_cell(spec, base, n_boot=300, seed=11)
    b = evaluate_cell(spec, base, n_boot=300, seed=11)
    c = evaluate_cell(spec, base, n_boot=300, seed=12)
    assert (a.ci_low, a.ci_high) == (b.ci_low, b.ci_high)
    assert (a.ci_low, a.ci_high) != (c.ci_low, c.ci_high)
    assert a.ratio == c.ratio


def test_block_bootstrap_widens_for_correlated_iterations() -> None:
    """Slowly drifting step times: i.i.d. resampling understates the spread, blocks do not."""
    rng = np.random.default_rng(5)
    n = 400
    drift = np.repeat(rng.normal(0, 3.0, n // 20), 20)  # 20-step plateaus
    s_num, s_den = 25.0 + drift, np.full(n, 2.0)
    b_num, b_den = 20.0 + rng.normal(0, 0.1, n), np.ones(n)
    widths = {}
    for block in (1, default_block_len(n) * 3):
        _, lo, hi = bootstrap_ratio_ci(
            s_num,
            s_den,
            b_num,
            b_den,
            n_boot=600,
            rng=np.random.default_rng(9),
            spec_block_len=block,
        )
        widths[block] = hi - lo
    assert widths[default_block_len(n) * 3] > 1.5 * widths[1]
    assert default_block_len(1000) == 10
    assert default_block_len(1) == 1


def test_chunked_bootstrap_matches_shapes() -> None:
    # Enough units that the bootstrap index matrix is built in several chunks.
    rng = np.random.default_rng(1)
    n = 30_000
    num, den = rng.uniform(9, 11, n), np.ones(n)
    ratio, lo, hi = bootstrap_ratio_ci(num, den, num * 0.5, den, n_boot=300, rng=rng)
    assert ratio == pytest.approx(2.0)
    assert lo < 2.0 < hi
    assert hi - lo < 0.02


def test_bad_cells_are_rejected() -> None:
    base = _iter_cell(4, 0, 20.0, 1.0, seed=1)
    spec = _iter_cell(4, 2, 26.0, 2.0, seed=2)
    with pytest.raises(BadInputError, match="baseline"):
        evaluate_cell(spec, spec)
    with pytest.raises(BadInputError, match="concurrency 8"):
        evaluate_cell(spec, _iter_cell(8, 0, 20.0, 1.0, seed=1))
    with pytest.raises(BadInputError, match="not enough requests"):
        evaluate_cell(spec, base, source="requests")
    with pytest.raises(BadInputError, match="n_boot"):
        bootstrap_ratio_ci(
            np.ones(3), np.ones(3), np.ones(3), np.ones(3), n_boot=0, rng=np.random.default_rng()
        )


def test_bad_samples_are_rejected() -> None:
    with pytest.raises(BadInputError, match="at least one token"):
        IterationSample(1.0, 1.0, 0.0, batch_size=4, confirmed_tokens=3)
    with pytest.raises(BadInputError, match="baseline step"):
        CellMeasurement(4, 0, iterations=iters([20.0], [4], [5]))
    with pytest.raises(BadInputError, match="acceptance positions"):
        CellMeasurement(4, 1, positions=PositionCounts((1, 1), (2, 1)))
    sample = IterationSample.from_per_request(1.0, 8.0, 0.5, [3, 1, 2])
    assert (sample.batch_size, sample.confirmed_tokens, sample.step_ms) == (3, 6, 9.5)
