"""Paired comparisons: the cost inequality from speculative and baseline blocks run side by side.

Why: a speculative cell compared with a baseline measured minutes earlier inherits every change
of the machine's speed in between (other tenants, clocks, throttling), and no bootstrap over
requests sees it: identical runs gave ratios of 0.24 and 0.86 for the same cell. So every ratio
is taken between measurements made in the same window of time.

Designs (:data:`~spectool.decide.verdict.Design`):

* ``interleaved``: short blocks alternate on one server that switches its draft length without a
  restart (spectool's engine): pair ``i`` is a speculative block and a baseline block measured
  back to back, in the order A B, B A, A B, ... (so a steady drift favours neither arm). Each
  pair gives ``d_i = log(lhs_i / rhs_i)`` (the cost inequality's two sides, from iterations when
  both blocks have them, else from requests; :mod:`spectool.decide.cost`). A change of speed
  between pairs moves both arms of a pair alike and cancels in ``d_i``; what is left varies
  from pair to pair and is measured by their spread.
* ``concurrent``: where a new draft length is a server restart but two identical GPU sets are
  there (``tune --gpus``), pair ``i`` is a speculative block and a baseline block started at the
  same moment on two servers, one per set (:mod:`spectool.tuning.side_by_side`, which also
  argues why such a pair is fair). Estimated exactly as ``interleaved``: a change of the
  machine's speed moves both blocks of a pair alike.
* ``bracketed``: where a new draft length is a server restart (trtllm-serve, minutes), the
  baseline is measured before and after the speculative cells; the cell is compared with both,
  and its interval spans both comparisons (:func:`bracketed_estimate`).

Estimate (interleaved): the weighted mean of the pairs' ratios, ``ratio = sum w_i r_i`` with
``r_i = exp(d_i)``: the workload's speculative time over its baseline time, with each pair's own
machine speed cancelled. Pairs of different prompts weigh by their baseline block's time (the
baseline's cost per token depends on the prompt's length); pairs of the same prompts (each
block the whole workload) by tokens (:func:`~spectool.decide.pair_stats.fit_pairs`). Pairs
send different prompts, and acceptance depends on the prompt, so the pairs' ratios differ by their prompts as well as by
noise; :mod:`spectool.tuning.trials` makes the pairs walk through shuffled passes over the
whole workload, so any first pairs are a random sample of it and a full pass is all of it; at
concurrency 1 every pass sends the same blocks, and pairs that sent the same prompts form
strata (``PairedCell.strata``). Its half-width on the log scale is ``t(df) * se / ratio``
(:mod:`spectool.decide.pair_stats`): once every stratum holds two pairs, ``se`` is the strata's
(the pairs' spread around their own stratum's mean: drift that the pairing did not cancel and
sampling noise; ``df`` pairs less strata); before, the weighted mean's between pairs (which
also counts the prompts' spread; ``df = n - 1``). Below :data:`FLOOR_BELOW_PAIRS` pairs it is
at least ``z * se_within`` (the pairs' own sampling noise, from a bootstrap of each block's
iterations or requests; it keeps two pairs that agree by chance from claiming precision they
do not have). Where every block sent the same prompts (each is the whole workload), a pair far
off the others is a disturbance and is set aside (``pair_stats.disturbed``). Blocks are
added until the interval is clear of the decision threshold (:func:`settled`), so the interval
is looked at several times: the confidence of each look is Bonferroni-corrected over the looks
a cell may take (``looks``), and a last look that the budget forced also spends the shares of
the looks it left untaken (:func:`look_alpha`), which keeps the chance of any wrong call at or
below ``1 - confidence``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spectool.decide.cell import CellMeasurement, pooled
from spectool.decide.cost import (
    bootstrap_ratio_ci,
    cell_verdict,
    default_block_len,
    resampled_sums,
    source_terms,
)
from spectool.decide.pair_stats import fit_pairs
from spectool.decide.verdict import (
    QUANTILES,
    CellVerdict,
    Design,
    PairedEstimate,
    Source,
    objective_source,
    proven_tie,
    verdict_for,
)
from spectool.errors import BadInputError

MIN_PAIRS = 2
# From this many pairs on the interval is the pairs' own (between-pair t interval) alone; below
# it the blocks' within-block noise floors it (two pairs can agree by chance). The floor is a
# bootstrap of each block's requests or iterations, which reads a block's ramp as noise: in the
# main job's cells (2026-12-04, four runs) it implied a per-pair spread of 0.11 (concurrency
# 16) and 0.27 (4) on the log against the pairs' measured 0.05-0.17 and 0.15-0.24, which
# include it. It was what held concurrency 16's interval open, not the pairs.
FLOOR_BELOW_PAIRS = 8
_WITHIN_BOOT = 400  # resamples per block for the within-pair noise


@dataclass(frozen=True)
class BlockPair:
    """A speculative block and the baseline block measured next to it (same concurrency)."""

    spec: CellMeasurement
    base: CellMeasurement
    spec_first: bool = True

    def __post_init__(self) -> None:
        where = f"pair (concurrency={self.spec.concurrency}, k={self.spec.k})"
        if self.spec.k < 1 or self.base.k != 0:
            raise BadInputError(
                where, f"need a speculative block and a baseline block, got k={self.base.k}"
            )
        if self.spec.concurrency != self.base.concurrency:
            raise BadInputError(where, f"baseline block ran at concurrency {self.base.concurrency}")


@dataclass(frozen=True)
class PairedCell:
    """A cell measured in pairs: the blocks, and both arms pooled (for reports and models)."""

    pairs: tuple[BlockPair, ...]
    design: Design = "interleaved"
    looks: int = 0  # how often the stopping rule may look at it (0: the caller says)
    objective: str = "steps"  # what the pairs compare (spectool.decide.verdict.OBJECTIVES)
    prompts_covered: int = 0  # distinct prompts its blocks sent (0: not recorded)
    workload_prompts: int = 0  # prompts in the workload (0: not recorded)
    # looks the budget left untaken: the budget (time, not the pairs' ratios) made the last
    # look the final one, so it spends their share of the error rate too (:func:`look_alpha`)
    rest_looks: int = 0
    # per pair, its stratum: pairs whose blocks sent the same prompts share one (numbered in
    # order of appearance; empty: not recorded). One stratum: every block is the whole
    # workload, so a far-off pair is a disturbance (pair_stats.disturbed); several, each with
    # two pairs or more: the interval is the strata's (pair_stats.stratified_ratio)
    strata: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.pairs:
            raise BadInputError("paired cell", "no pairs")
        keys = {p.spec.key for p in self.pairs}
        if len(keys) != 1:
            raise BadInputError("paired cell", f"pairs of different cells: {sorted(keys)}")
        if self.strata and len(self.strata) != len(self.pairs):
            raise BadInputError(
                "paired cell", f"{len(self.strata)} strata for {len(self.pairs)} pairs"
            )

    @property
    def same_prompts(self) -> bool:
        """Every block sent the same prompts, as often: blocks differ by the machine alone."""
        return len(set(self.strata)) == 1

    @property
    def key(self) -> tuple[int, int]:
        return self.pairs[0].spec.key

    @property
    def spec(self) -> CellMeasurement:
        """Every speculative block pooled."""
        return pooled([p.spec for p in self.pairs])

    @property
    def base(self) -> CellMeasurement:
        """Every baseline block pooled."""
        return pooled([p.base for p in self.pairs])


def _terms(spec: CellMeasurement, base: CellMeasurement, source: Source) -> tuple[np.ndarray, ...]:
    return (*source_terms(spec, source), *source_terms(base, source))


def pair_source(pairs: Sequence[BlockPair], objective: str = "steps") -> Source:
    """What ``objective`` compares (:data:`~spectool.decide.verdict.OBJECTIVES`); for
    ``steps``, iterations when every block has them, else requests."""
    fixed = objective_source(objective)
    if fixed is not None:
        return fixed
    if all(p.spec.iterations and p.base.iterations for p in pairs):
        return "iterations"
    return "requests"


def _ms_per_token(cell: CellMeasurement, source: Source) -> float:
    num, den = source_terms(cell, source)
    if den.size == 0 or den.sum() <= 0:
        raise BadInputError(
            f"block (concurrency={cell.concurrency}, k={cell.k})", f"no {source} to measure"
        )
    return float(num.sum() / den.sum())


def _log_ratio_and_var(
    pair: BlockPair, source: Source, rng: np.random.Generator
) -> tuple[float, float, float, float]:
    """The pair's log ratio, its within-block variance, and the baseline block's tokens and
    time (its weights, :func:`~spectool.decide.pair_stats.fit_pairs`)."""
    s_num, s_den, b_num, b_den = _terms(pair.spec, pair.base, source)
    if min(s_num.size, b_num.size) < 2:
        raise BadInputError(
            f"pair (concurrency={pair.spec.concurrency}, k={pair.spec.k})",
            f"not enough {source} in a block ({s_num.size} with speculation, {b_num.size} without)",
        )
    d = math.log((s_num.sum() / s_den.sum()) / (b_num.sum() / b_den.sum()))
    blocks = (
        (default_block_len(s_num.size), default_block_len(b_num.size))
        if source == "iterations"
        else (1, 1)
    )
    sn, sd = resampled_sums(s_num, s_den, _WITHIN_BOOT, rng, blocks[0])
    bn, bd = resampled_sums(b_num, b_den, _WITHIN_BOOT, rng, blocks[1])
    boot = np.log((sn / sd) / (bn / bd))
    return d, float(boot.var(ddof=1)), float(b_den.sum()), float(b_num.sum())


def paired_estimate(
    cell: PairedCell,
    *,
    confidence: float = 0.95,
    looks: int = 1,
    seed: int = 0,
) -> PairedEstimate:
    """The ratio and its interval from ``cell``'s pairs (at least :data:`MIN_PAIRS`).

    ``looks``: how many times the interval may be looked at while blocks are added (the
    cell's own ``looks`` when it records them); each look gets confidence
    ``1 - (1 - confidence) / looks``.
    """
    from scipy import stats

    c, k = cell.key
    if len(cell.pairs) < MIN_PAIRS:
        raise BadInputError(
            f"cell (concurrency={c}, k={k})", f"need {MIN_PAIRS} pairs, got {len(cell.pairs)}"
        )
    if not 0.0 < confidence < 1.0 or looks < 1:
        raise BadInputError(
            "paired estimate", f"need 0 < confidence < 1 and looks >= 1, got {confidence}, {looks}"
        )
    looks = cell.looks or looks
    if not 0 <= cell.rest_looks < looks:
        raise BadInputError(
            f"cell (concurrency={c}, k={k})", f"{cell.rest_looks} looks left of {looks}"
        )
    source = pair_source(cell.pairs, cell.objective)
    rng = np.random.default_rng([seed, c, k, 7])
    if cell.objective in QUANTILES:
        return quantile_estimate(
            cell, source, QUANTILES[cell.objective], confidence=confidence, looks=looks, rng=rng
        )
    logs, variances, tokens, times = zip(
        *(_log_ratio_and_var(p, source, rng) for p in cell.pairs), strict=True
    )
    d = np.array(logs)
    fit = fit_pairs(d, np.array(tokens), cell.strata, np.array(times))
    ratio, kept = fit.ratio, fit.kept
    spread = float(d[kept].std(ddof=1))
    within_se = math.sqrt(sum(variances[i] for i in kept)) / kept.size
    alpha = look_alpha(confidence, looks, cell.rest_looks)
    half = float(stats.t.ppf(1.0 - alpha / 2.0, fit.df)) * fit.log_se
    if d.size < FLOOR_BELOW_PAIRS:  # pairs measured: one set aside leaves 7 of 8
        half = max(half, float(stats.norm.ppf(1.0 - alpha / 2.0)) * within_se)
    low, high = ratio * math.exp(-half), ratio * math.exp(half)
    return _estimate(
        cell,
        source,
        (ratio, low, high),
        d,
        spread,
        within_se,
        confidence,
        looks,
        fit.set_aside,
        fit.strata,
    )


def _estimate(
    cell: PairedCell,
    source: Source,
    interval: tuple[float, float, float],
    d: np.ndarray,
    spread: float,
    within_se: float,
    confidence: float,
    looks: int,
    set_aside: tuple[int, ...] = (),
    strata: int = 0,
) -> PairedEstimate:
    """The estimate ``(ratio, low, high)`` of ``cell`` with its pairs' ``d_i`` (every pair's,
    also those ``set_aside``) and the drift of each arm from its first block to its last."""
    ratio, low, high = interval
    firsts, lasts = cell.pairs[0], cell.pairs[-1]
    return PairedEstimate(
        ratio=ratio,
        ci_low=low,
        ci_high=high,
        verdict=verdict_for(low, high),
        design=cell.design,
        source=source,
        log_ratios=tuple(float(x) for x in d),
        spread=spread,
        within_se=within_se,
        drift_base=_ms_per_token(lasts.base, source) / _ms_per_token(firsts.base, source),
        drift_spec=_ms_per_token(lasts.spec, source) / _ms_per_token(firsts.spec, source),
        confidence=confidence,
        looks=looks,
        prompts_covered=cell.prompts_covered,
        workload_prompts=cell.workload_prompts,
        rest_looks=cell.rest_looks,
        set_aside=set_aside,
        strata=strata,
    )


def request_values(cell: CellMeasurement, source: Source) -> np.ndarray:
    """Per request of ``cell``: its TPOT (``requests``), E2E or TTFT, in ms (the units the
    requests' means are taken over, :func:`~spectool.decide.cost.source_terms`)."""
    num, den = source_terms(cell, source)
    return num / den


_QUANTILE_BOOT = 1000


def quantile_estimate(
    cell: PairedCell,
    source: Source,
    q: float,
    *,
    confidence: float,
    looks: int,
    rng: np.random.Generator,
) -> PairedEstimate:
    """The ratio of the ``q``-th percentiles of a per-request metric, each arm's blocks pooled.

    Why pooled: a block holds a few requests (two waves of the concurrency), too few for a
    tail of its own; all of an arm's blocks together hold the workload's. The interval is a
    bootstrap over the *pairs* (both blocks of a resampled pair go together, so the drift the
    pairing cancels stays cancelled), at the looks' Bonferroni-corrected confidence. Each
    pair's own percentile ratio is kept as its ``d_i`` for the report.
    """
    spec = [request_values(p.spec, source) for p in cell.pairs]
    base = [request_values(p.base, source) for p in cell.pairs]
    if min(v.size for v in (*spec, *base)) < 1:
        raise BadInputError(f"cell {cell.key}", f"a block holds no {source} to take a tail of")

    def ratio_of(idx: Sequence[int]) -> float:
        s = np.concatenate([spec[i] for i in idx])
        b = np.concatenate([base[i] for i in idx])
        return float(np.percentile(s, q) / np.percentile(b, q))

    n = len(cell.pairs)
    ratio = ratio_of(range(n))
    boot = np.log([ratio_of(rng.integers(0, n, size=n)) for _ in range(_QUANTILE_BOOT)])
    alpha = look_alpha(confidence, looks, cell.rest_looks)
    low, high = (math.exp(x) for x in np.quantile(boot, [alpha / 2.0, 1.0 - alpha / 2.0]))
    low, high = min(low, ratio), max(high, ratio)
    d = np.log([np.percentile(s, q) / np.percentile(b, q) for s, b in zip(spec, base, strict=True)])
    spread = float(d.std(ddof=1)) if n > 1 else 0.0
    within = float(boot.std(ddof=1))
    return _estimate(cell, source, (ratio, low, high), d, spread, within, confidence, looks)


def look_alpha(confidence: float, looks: int, rest_looks: int = 0) -> float:
    """The error rate of one look at a cell's interval: ``1 - confidence`` shared over the
    ``looks`` a cell may take (Bonferroni), and at a last look that the budget forced, the
    shares of the ``rest_looks`` it will never take as well. The shares spent over the looks
    taken still sum to at most ``1 - confidence``, because the budget, not the data, chose
    which look was the last: at concurrency 16, where a 30 s budget ends every cell at the
    second of six looks, the last look is at 5/6 of the error rate instead of 1/6 (t on 7
    degrees of freedom 2.44 instead of 3.9)."""
    return (1.0 - confidence) * (1 + rest_looks) / looks


def settled(estimate: PairedEstimate, threshold: float = 1.0) -> bool:
    """Whether the interval lies wholly on one side of ``threshold`` (1, or ``1 - min_gain``),
    or proves a tie with off (within ``1 +- TIE_MARGIN``: off is deployed, more pairs would not
    change that, :func:`~spectool.decide.verdict.proven_tie`)."""
    low, high = estimate.ci_low, estimate.ci_high
    return high < threshold or low > threshold or proven_tie(low, high)


def bracketed_estimate(
    spec: CellMeasurement,
    before: CellMeasurement,
    after: CellMeasurement,
    *,
    confidence: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
    objective: str = "steps",
) -> PairedEstimate:
    """``spec`` against baselines measured before and after it (a restart per draft length).

    The ratio is taken against both baselines pooled; the interval spans the bootstrap
    intervals against each one alone, so a baseline that moved between the two brackets widens
    it by as much as it moved. ``objective``: what is compared (see :func:`pair_source`).
    """
    source: Source = objective_source(objective) or (
        "iterations" if spec.iterations and before.iterations and after.iterations else "requests"
    )
    rng = np.random.default_rng([seed, spec.concurrency, spec.k, 11])
    s_num, s_den, _, _ = _terms(spec, before, source)
    results = []
    for base in (pooled([before, after]), before, after):
        _, _, b_num, b_den = _terms(spec, base, source)
        blocks = (
            (default_block_len(s_num.size), default_block_len(b_num.size))
            if source == "iterations"
            else (1, 1)
        )
        results.append(
            bootstrap_ratio_ci(
                s_num,
                s_den,
                b_num,
                b_den,
                n_boot=n_boot,
                confidence=confidence,
                rng=rng,
                spec_block_len=blocks[0],
                base_block_len=blocks[1],
            )
        )
    ratio = results[0][0]
    low = min(r[1] for r in results)
    high = max(r[2] for r in results)
    return PairedEstimate(
        ratio=ratio,
        ci_low=low,
        ci_high=high,
        verdict=verdict_for(low, high),
        design="bracketed",
        source=source,
        log_ratios=(math.log(results[1][0]), math.log(results[2][0])),
        spread=abs(math.log(results[1][0]) - math.log(results[2][0])) / math.sqrt(2.0),
        within_se=0.0,
        drift_base=_ms_per_token(after, source) / _ms_per_token(before, source),
        drift_spec=1.0,
        confidence=confidence,
        looks=1,
    )


def evaluate_paired(
    cell: PairedCell,
    *,
    alphas: Sequence[float] | None = None,
    confidence: float = 0.95,
    looks: int = 1,
    n_boot: int = 1000,
    seed: int = 0,
) -> CellVerdict:
    """The cost inequality for a paired cell: :func:`paired_estimate`'s ratio and interval,
    the pooled arms' sides and tokens per step (as :func:`~spectool.decide.cost.evaluate_cell`
    reports them)."""
    estimate = paired_estimate(cell, confidence=confidence, looks=looks, seed=seed)
    return verdict_from_estimate(cell.spec, cell.base, estimate, alphas=alphas, n_boot=n_boot)


def verdict_from_estimate(
    spec: CellMeasurement,
    base: CellMeasurement,
    estimate: PairedEstimate,
    *,
    alphas: Sequence[float] | None,
    n_boot: int,
) -> CellVerdict:
    """A :class:`CellVerdict` whose ratio and interval are ``estimate``'s."""
    return cell_verdict(
        spec,
        _terms(spec, base, estimate.source),
        ratio=estimate.ratio,
        interval=(estimate.ci_low, estimate.ci_high),
        source=estimate.source,
        confidence=estimate.confidence,
        n_boot=n_boot,
        alphas=alphas,
        paired=estimate,
    )
