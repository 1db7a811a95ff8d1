"""Paired comparisons: drift cancels within pairs, intervals stay honest, bracketing spans both."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from spectool.decide.cell import CellMeasurement, IterationSample
from spectool.decide.cost import evaluate_cell, source_terms
from spectool.decide.pair_stats import disturbed, stratified_ratio
from spectool.decide.paired import (
    BlockPair,
    PairedCell,
    bracketed_estimate,
    evaluate_paired,
    paired_estimate,
    settled,
)
from spectool.errors import BadInputError

BASE_MS, SPEC_MS, TOKENS = 10.0, 20.0, 3  # true ratio (20 / 3) / 10 = 2/3
TRUE_RATIO = SPEC_MS / TOKENS / BASE_MS


def block(k: int, speed: float, *, noise: float = 0.02, seed: int = 0, steps: int = 60):
    """A block of ``steps`` decode steps at batch 2 on a machine ``speed`` times slower."""
    rng = np.random.default_rng(seed)
    ms = (SPEC_MS if k else BASE_MS) * speed
    samples = tuple(
        IterationSample(
            0.0, ms * float(rng.lognormal(0.0, noise)), 0.0, 2, 2 * (TOKENS if k else 1)
        )
        for _ in range(steps)
    )
    return CellMeasurement(4, k, iterations=samples)


def pairs_under(speeds: list[float], *, noise: float = 0.02) -> PairedCell:
    """Pairs whose two blocks ran at the same machine speed (the speed changes between pairs)."""
    return PairedCell(
        tuple(
            BlockPair(
                block(3, s, noise=noise, seed=2 * i),
                block(0, s, noise=noise, seed=2 * i + 1),
                i % 2 == 0,
            )
            for i, s in enumerate(speeds)
        )
    )


def test_a_drift_both_arms_share_cancels_in_the_pairs() -> None:
    speeds = [1.0, 1.8, 0.7, 1.3, 2.2, 1.0, 0.9, 1.5]  # the machine's speed swings 3x
    cell = pairs_under(speeds)
    est = paired_estimate(cell, confidence=0.95)
    assert est.ratio == pytest.approx(TRUE_RATIO, rel=0.02)
    assert est.ci_low < TRUE_RATIO < est.ci_high and est.ci_high < 0.75
    assert est.verdict == "pays" and est.pairs == 8 and est.design == "interleaved"
    assert est.drift_base == pytest.approx(1.5, rel=0.05)  # last pair ran 1.5x slower
    # the unpaired design on the same blocks: a speculative block from a fast minute against
    # a baseline from a slow one (and the converse) gives very different, wrong answers
    fast_spec = evaluate_cell(cell.pairs[2].spec, cell.pairs[4].base, n_boot=200)
    slow_spec = evaluate_cell(cell.pairs[4].spec, cell.pairs[2].base, n_boot=200)
    assert fast_spec.ratio < 0.25 and slow_spec.ratio > 2.0
    assert fast_spec.verdict == "pays" and slow_spec.verdict == "does_not_pay"  # a flip


def test_pairs_that_disagree_widen_the_interval_and_more_looks_widen_it_further() -> None:
    # the drift hits the two arms of each pair differently (it changed mid-pair)
    cell = PairedCell(
        tuple(
            BlockPair(block(3, 1.0 + 0.3 * (i % 2)), block(0, 1.0 + 0.3 * ((i + 1) % 2)))
            for i in range(4)
        )
    )
    one = paired_estimate(cell, looks=1)
    six = paired_estimate(cell, looks=6)
    assert one.spread > 0.2
    assert one.ci_low < one.ratio < one.ci_high
    assert six.ci_low < one.ci_low and six.ci_high > one.ci_high  # Bonferroni over the looks


def test_two_pairs_that_agree_by_chance_keep_their_own_sampling_noise() -> None:
    # identical pairs: no spread at all, but each block is a noisy sample of steps
    pair = BlockPair(block(3, 1.0, noise=0.3, steps=8), block(0, 1.0, noise=0.3, steps=8, seed=1))
    est = paired_estimate(PairedCell((pair, pair)))
    assert est.spread == 0.0 and est.within_se > 0.05
    assert est.ci_high / est.ci_low > 1.2


def test_from_eight_pairs_the_interval_is_the_pairs_own() -> None:
    """The within-block bootstrap floors the interval below 8 pairs only: from there the pairs'
    spread, which holds each block's own noise, is the measure (the bootstrap overstates it)."""
    from scipy import stats

    # each pair's two blocks draw the same noisy steps (so they agree closely: the pairs'
    # spread is the 2% speed steps only), while a bootstrap of a block's 8 steps sees 30% noise
    noisy = [
        BlockPair(
            block(3, 1.0 + 0.02 * (i % 3), noise=0.3, steps=8, seed=i),
            block(0, 1.0, noise=0.3, steps=8, seed=i),
        )
        for i in range(8)
    ]
    for n in (4, 8):
        est = paired_estimate(PairedCell(tuple(noisy[:n])))
        r = np.exp(est.log_ratios)
        t_half = float(stats.t.ppf(0.975, n - 1)) * np.std(r, ddof=1) / np.sqrt(n) / est.ratio
        z_half = float(stats.norm.ppf(0.975)) * est.within_se
        half = np.log(est.ci_high / est.ratio)
        assert z_half > 2 * t_half  # the bootstrap says far more noise than the pairs show
        assert half == pytest.approx(z_half if n < 8 else t_half, rel=0.01)


def test_a_last_look_the_budget_forced_spends_the_looks_it_left() -> None:
    from scipy import stats

    pairs = pairs_under([1.0, 1.3, 0.9, 1.1, 1.2, 0.8, 1.0, 1.4], noise=0.1).pairs
    six = paired_estimate(PairedCell(pairs, looks=6))
    rest = paired_estimate(PairedCell(pairs, looks=6, rest_looks=4))
    assert rest.ratio == six.ratio and rest.to_json()["rest_looks"] == 4
    width = np.log(six.ci_high / six.ratio) / np.log(rest.ci_high / rest.ratio)
    t = [float(stats.t.ppf(1 - a / 2, 7)) for a in (0.05 / 6, 0.05 * 5 / 6)]
    assert width == pytest.approx(t[0] / t[1], rel=1e-6)  # 3.9 / 2.4
    with pytest.raises(BadInputError, match="6 looks left of 6"):
        paired_estimate(PairedCell(pairs, looks=6, rest_looks=6))


def test_settled_is_wholly_one_side_of_the_threshold() -> None:
    est = paired_estimate(pairs_under([1.0, 1.1, 0.9, 1.0]))
    assert settled(est, 1.0) and est.ci_high < 1.0
    assert not settled(est, est.ratio)  # a threshold inside the interval
    assert settled(est, 0.5)  # the interval lies wholly above 0.5


def test_a_proven_tie_with_off_settles_a_cell() -> None:
    """Issue 21: an interval within 1 +- 5% proves the cell as fast as off (off is deployed, the
    cheaper); more pairs would not change that, so the cell stops. Wider, it goes on."""
    est = paired_estimate(pairs_under([1.0, 1.1, 0.9, 1.0]))
    tied = dataclasses.replace(est, ratio=0.99, ci_low=0.96, ci_high=1.03, verdict="inconclusive")
    assert settled(tied, 1.0)
    assert not settled(dataclasses.replace(tied, ci_low=0.94), 1.0)
    assert not settled(dataclasses.replace(tied, ci_high=1.06), 1.0)


def test_evaluate_paired_reports_both_arms_and_the_estimate() -> None:
    cell = pairs_under([1.0, 1.2, 0.8, 1.0])
    v = evaluate_paired(cell, alphas=[0.9, 0.8, 0.7], looks=6, n_boot=200)
    assert v.design == "interleaved" and v.paired is not None and v.paired.looks == 6
    assert v.ratio == v.paired.ratio and v.verdict == "pays"
    assert v.tokens_per_step_measured == pytest.approx(TOKENS)
    assert v.lhs_ms_per_token == pytest.approx(SPEC_MS * 1.0 / TOKENS, rel=0.05)
    data = v.to_json()
    assert data["design"] == "interleaved" and data["pairs"] == 4
    # pairs of different prompts (no strata recorded): their ratios weighted by the baseline's
    # time in each, the workload's time over its baseline time (not their plain mean: the
    # machine's speed differs between these pairs)
    base = np.array([source_terms(p.base, "iterations")[0].sum() for p in cell.pairs])
    mean = float((base * np.array(data["pair_ratios"])).sum() / base.sum())
    assert data["ratio"] == pytest.approx(mean)
    assert data["ratio"] != pytest.approx(np.mean(data["pair_ratios"]), rel=1e-6)


def test_bracketed_interval_spans_both_baselines() -> None:
    spec = block(3, 1.0)
    before, after = block(0, 1.0, seed=5), block(0, 1.4, seed=6)  # the machine slowed 40%
    est = bracketed_estimate(spec, before, after, n_boot=300)
    vs_before = bracketed_estimate(spec, before, before, n_boot=300)
    vs_after = bracketed_estimate(spec, after, after, n_boot=300)
    assert est.design == "bracketed"
    assert est.drift_base == pytest.approx(1.4, rel=0.05)
    # (each bootstrap draws its own resamples: equal up to their noise)
    assert est.ci_low <= vs_after.ci_low * 1.01 and est.ci_high >= vs_before.ci_high * 0.99
    assert vs_after.ratio < est.ratio < vs_before.ratio


def test_too_few_pairs_or_mixed_cells_are_refused() -> None:
    with pytest.raises(BadInputError, match="2 pairs"):
        paired_estimate(pairs_under([1.0]))
    with pytest.raises(BadInputError, match="baseline block"):
        BlockPair(block(3, 1.0), block(3, 1.0))
    with pytest.raises(BadInputError, match="different cells"):
        PairedCell(
            (BlockPair(block(3, 1.0), block(0, 1.0)), BlockPair(block(2, 1.0), block(0, 1.0)))
        )


def _requests_block(k: int, tpots: list[float], shift: float = 0.0) -> CellMeasurement:
    """A block of requests, request i streaming 9 tokens at ``tpots[i]`` seconds each."""
    from spectool.decide.latency import RequestRecord

    records = []
    for i, tpot in enumerate(tpots):
        send = shift + 0.01 * i
        first = send + 0.02
        chunks = tuple(first + tpot * j for j in range(9))
        records.append(RequestRecord(f"r{i}", "c", send, first, chunks, (1,) * 9, chunks[-1], 8, 9))
    return CellMeasurement(concurrency=4, k=k, records=tuple(records), duration_s=1.0)


def test_a_tail_objective_sees_the_tail_the_mean_hides() -> None:
    """The deployment is twice as fast for 9 requests in 10 and 3x slower for the tenth: the mean
    TPOT pays, the p99 TPOT is proven slower (each arm's blocks pooled)."""
    rng = np.random.default_rng(5)
    pairs = []
    for i in range(8):
        base = [0.010 * (1 + 0.05 * rng.standard_normal()) for _ in range(10)]
        spec = [0.005 * (1 + 0.05 * rng.standard_normal()) for _ in range(9)] + [0.030]
        pairs.append(BlockPair(_requests_block(3, spec, i), _requests_block(0, base, i)))
    mean = paired_estimate(PairedCell(tuple(pairs), objective="tpot"))
    tail = paired_estimate(PairedCell(tuple(pairs), objective="tpot@p99"))
    assert mean.verdict == "pays" and mean.ratio < 0.8
    assert tail.verdict == "does_not_pay" and tail.ratio > 2.0
    assert tail.pairs == 8 and tail.source == "requests"
    p90 = paired_estimate(PairedCell(tuple(pairs), objective="tpot@p90"))
    assert p90.ratio < tail.ratio


def _disturbed_cell(same_prompts: bool) -> PairedCell:
    """The main job's concurrency-16 cell of 2026-12-05 in shape: seven pairs whose two
    blocks ran alike (speculation 6% faster per token, each pair's machine speed its own) and
    one whose baseline block ran 1.5x faster than its speculative block (a disturbance)."""
    speeds = [1.0, 1.1, 0.95, 1.05, 1.0, 0.9, 1.1, 1.0]
    pairs = []
    for i, s in enumerate(speeds):
        spec = block(3, s * 0.94 * (1.0 + 0.02 * (i % 3 - 1)), seed=2 * i)
        base = block(0, s / (1.55 if i == 5 else 1.0) * TRUE_RATIO, seed=2 * i + 1)
        pairs.append(BlockPair(spec, base, i % 2 == 0))
    # one stratum: every block sent the same prompts; else each pair its own prompts
    strata = (0,) * len(pairs) if same_prompts else tuple(range(len(pairs)))
    return PairedCell(tuple(pairs), strata=strata)


def test_a_disturbed_pair_of_whole_workload_blocks_is_set_aside() -> None:
    kept = paired_estimate(_disturbed_cell(same_prompts=True), looks=6)
    counted = paired_estimate(_disturbed_cell(same_prompts=False), looks=6)
    # every pair counts where blocks send different prompts: the one disturbed pair (weighted
    # by its baseline block's time, short there) opens the interval over 1 (today's flip) ...
    assert counted.set_aside == () and counted.verdict == "inconclusive"
    assert counted.ci_high > 1.0 and counted.ratio > 0.97
    # ... where every block sent the same prompts it is the machine's, set aside and recorded
    assert kept.set_aside == (5,) and kept.pairs == 8
    assert kept.ratio == pytest.approx(0.94, rel=0.02)
    assert kept.verdict == "pays" and kept.ci_high < 0.98
    assert kept.to_json()["set_aside"] == [5]
    from spectool.tuning.pairing import drift_notes

    verdict = evaluate_paired(_disturbed_cell(same_prompts=True), looks=6, n_boot=100)
    (note,) = [n for n in drift_notes([verdict], {}) if "set aside" in n]
    assert "pair 6 (1.48" in note and "of 8 set aside as disturbed" in note


def test_pairs_are_set_aside_only_far_off_and_at_most_one_in_eight() -> None:
    rng = np.random.default_rng(3)
    # the noise of normal pairs alone: one set aside in few cells
    hits = sum(bool(disturbed(rng.normal(0.0, 0.05, 8))) for _ in range(2000))
    assert hits / 2000 < 0.03
    assert disturbed(rng.normal(0.0, 0.05, 7) + np.array([0, 0, 0, 0, 0, 0, 1.0])) == ()
    d = np.array([0.0, 0.01, -0.01, 0.02, -0.02, 0.5, 0.0, 0.01])
    assert disturbed(d) == (5,)
    two = np.concatenate([d, d])  # 16 pairs: at most two, the farthest
    assert disturbed(two) == (5, 13)
    three = two.copy()
    three[0] = -0.4
    assert disturbed(three) == ()  # more far-off pairs than one in 8: that is the noise
    benign = np.log([0.95, 0.92, 0.93, 0.91, 0.99, 0.92, 0.86, 0.92])
    assert disturbed(benign) == ()  # three alike do not make 0.99 far off
    assert disturbed(np.zeros(8)) == ()  # no spread: nothing is far off


def test_setting_aside_keeps_the_intervals_coverage() -> None:
    """Cells of 8 pairs at the main job's last look (95.8% nominal): normal pairs, and
    pairs of which one in a quarter of the cells is shifted 7-17 standard deviations."""
    from scipy import stats

    rng = np.random.default_rng(5)
    alpha, cells = 0.05 * 5 / 6, 3000
    t = {n: float(stats.t.ppf(1 - alpha / 2, n - 1)) for n in (7, 8)}
    for shifted in (False, True):
        covered, widths, whole = 0, 0.0, 0.0
        for _ in range(cells):
            d = rng.normal(0.0, 1.0, 8)
            if shifted and rng.random() < 0.25:
                d[rng.integers(8)] += rng.choice([-1, 1]) * rng.uniform(7, 17)
            whole_half = t[8] * d.std(ddof=1) / np.sqrt(8)
            kept = np.delete(d, list(disturbed(d)))
            half = t[kept.size] * kept.std(ddof=1) / np.sqrt(kept.size)
            covered += abs(kept.mean()) <= half
            widths, whole = widths + half, whole + whole_half
        assert covered / cells > 0.935
        assert widths / whole < (0.7 if shifted else 1.0)  # narrower where pairs were set aside


def _strata_cell(effects: list[float], passes: int, *, recorded: bool) -> PairedCell:
    """Pairs walking ``passes`` passes over prompts in ``len(effects)`` blocks: block ``s``'s
    prompts give the ratio ``effects[s]``, the machine +-3% on top (lognormal)."""
    rng = np.random.default_rng(11)
    pairs, strata = [], []
    for i in range(passes * len(effects)):
        s = i % len(effects)
        spec_speed = effects[s] / TRUE_RATIO * float(rng.lognormal(0.0, 0.03))
        pairs.append(BlockPair(block(3, spec_speed, seed=2 * i), block(0, 1.0, seed=2 * i + 1)))
        strata.append(s)
    return PairedCell(tuple(pairs), strata=tuple(strata) if recorded else ())


def test_strata_of_the_same_prompts_take_the_prompts_spread_out_of_the_interval() -> None:
    """Four blocks of prompts at 0.5, 0.7, 0.9 and 1.1 (n-gram on prompts it knows and does
    not), five passes: the workload's ratio is 0.8. Between pairs, the prompts' spread reads
    as noise; by strata, the interval is the machine's +-3% alone."""
    effects, truth = [0.5, 0.7, 0.9, 1.1], 0.8
    by_strata = paired_estimate(_strata_cell(effects, 5, recorded=True))
    between = paired_estimate(_strata_cell(effects, 5, recorded=False))
    assert by_strata.strata == 4 and between.strata == 0
    for est in (by_strata, between):
        assert est.ratio == pytest.approx(truth, rel=0.02)
        assert est.ci_low < truth < est.ci_high
    assert by_strata.ci_high / by_strata.ci_low < 1.04
    assert between.ci_high / between.ci_low > 1.2
    # one pass: no stratum measured twice, so the interval is the pairs' own
    assert paired_estimate(_strata_cell(effects, 1, recorded=True)).strata == 0


def test_the_strata_interval_covers_the_workloads_ratio() -> None:
    """Seeded simulation of the main job's shapes: 16 strata measured twice (concurrency 1)
    and 4 measured five times (concurrency 4); each stratum's prompts its own ratio (spread
    0.3 on the log), the machine 0.1 per pair on top, token weights unequal."""
    from scipy import stats

    rng = np.random.default_rng(2)
    for strata_n, passes in ((16, 2), (4, 5)):
        covered, cells = 0, 2000
        strata = np.tile(np.arange(strata_n), passes)
        for _ in range(cells):
            effects = rng.normal(-0.2, 0.3, strata_n)
            size = rng.uniform(50, 150, strata_n)  # each stratum's tokens a block
            truth = float((size * np.exp(effects + 0.1**2 / 2)).sum() / size.sum())
            d = effects[strata] + rng.normal(0.0, 0.1, strata.size)
            weights = size[strata] * rng.uniform(0.9, 1.1, strata.size)
            ratio, log_se, df = stratified_ratio(d, weights, strata)
            assert df == strata.size - strata_n
            half = float(stats.t.ppf(0.975, df)) * log_se
            covered += ratio * math.exp(-half) <= truth <= ratio * math.exp(half)
        assert covered / cells > 0.93
