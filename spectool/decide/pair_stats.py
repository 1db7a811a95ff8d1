"""How a paired cell's pairs become one ratio with the standard error of its log.

The pairs' log ratios ``d_i`` (speculative over baseline block, or method over method head
to head), their tokens and their times on the denominator's side (the baseline's, or the
rival's) in; the workload's ratio out: the weighted mean between
pairs (:func:`weighted_ratio`), or by strata of the same prompts (:func:`stratified_ratio`),
without the pairs set aside as disturbed (:func:`disturbed`); :func:`fit_pairs` chooses. Used
by :mod:`spectool.decide.paired` and :mod:`spectool.decide.duel`. Pure: arrays in, numbers
out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spectool.errors import BadInputError

# A pair of a cell whose blocks all send the same prompts is set aside as disturbed when its log
# ratio lies more than this many standard deviations of the other pairs from their mean; at
# most one pair in SET_ASIDE_PER, from that many pairs on (disturbed).
DISTURBED_SDS = 6.0
SET_ASIDE_PER = 8


@dataclass(frozen=True)
class PairsFit:
    """The pairs' ratio, the standard error of its log on ``df`` degrees of freedom, the
    strata it used (0: between pairs), the pairs set aside and the pairs ``kept``."""

    ratio: float
    log_se: float
    df: int
    strata: int
    set_aside: tuple[int, ...]
    kept: np.ndarray


def fit_pairs(
    log_ratios: np.ndarray,
    weights: np.ndarray,
    strata: Sequence[int],
    times: np.ndarray | None = None,
) -> PairsFit:
    """The pairs' ratio (a paired cell's or a head-to-head's); ``weights``: each pair's tokens;
    ``strata``: per pair, its stratum of the same prompts (empty: not recorded); ``times``:
    each pair's time on the denominator's side, the baseline's or the rival's (None: the
    weights).

    The workload's ratio is its time over the denominator's time, so pairs of different
    prompts weigh by that time: the denominator's cost per token depends on the prompt (a
    rival's through its acceptance; by tokens alone a head-to-head of n-gram against a draft
    model on prose at concurrency 1 read 0.988 where the times say 0.944). With one stratum
    (every block sent the same prompts, so every pair stands for the same workload) the pairs
    weigh by tokens, after those far off the others are set aside (:func:`disturbed`). With
    several, each holding two pairs or more, the ratio is the strata's, each weighted by its
    mean time a block (:func:`stratified_ratio`); else, each pair its own prompts, the mean
    between pairs weighted by their times (:func:`weighted_ratio`, ``n - 1`` degrees of
    freedom).
    """
    times = weights if times is None else times
    aside = disturbed(log_ratios) if len(set(strata)) == 1 else ()
    kept = np.array([i for i in range(log_ratios.size) if i not in aside])
    d, w, t = log_ratios[kept], weights[kept], times[kept]
    one_stratum = False
    if len(strata):
        groups = np.asarray(strata)[kept]
        counts = np.bincount(groups)
        counts = counts[counts > 0]
        one_stratum = counts.size == 1
        if counts.size > 1 and counts.min() >= 2:
            ratio, log_se, df = stratified_ratio(d, w, groups, t)
            return PairsFit(ratio, log_se, df, int(counts.size), aside, kept)
    ratio, log_se = weighted_ratio(d, w if one_stratum else t)
    return PairsFit(ratio, log_se, d.size - 1, 0, aside, kept)


def stratified_ratio(
    log_ratios: np.ndarray,
    weights: np.ndarray,
    strata: np.ndarray,
    times: np.ndarray | None = None,
) -> tuple[float, float, int]:
    """The workload's ratio from pairs in strata of the same prompts, with the standard error
    of its log and its degrees of freedom (pairs less strata).

    At concurrency 1 every pass over the workload sends the same blocks
    (:meth:`spectool.tuning.trials.CellPlan.block_config`), so pair ``i`` and pair ``i +
    pass_pairs`` send the same prompts, one at a time. Within a stratum the pairs' ratios
    differ by the machine alone; between strata also by their prompts, which is no
    uncertainty about *this workload's* ratio once every stratum has been measured: the
    estimate is each stratum's token-weighted mean ``m_s``, weighted by the stratum's mean
    ``times`` a block (``u_s``: the denominator's time on its prompts, so the workload's time
    over the denominator's; None: its tokens a block), and its variance
    ``sigma^2 * sum_s (u_s / U)^2 * sum_{i in s} (w_i / W_s)^2`` with ``sigma^2`` the pairs' spread around their stratum's
    mean, pooled (``N - S`` degrees of freedom). The between-pairs t interval counts the
    prompts' spread as noise: at concurrency 1 the main job's pair ratios on the same prompts
    correlate 0.73-0.89 from one run to the next (0.07-0.16 of their 0.18-0.36 spread on the
    log is the machine's), so it was two to three times too wide there. Where a block's
    requests run together, its grouping and their arrivals move its ratio too, which is no
    fixed fact of the workload: there blocks are shuffled anew each pass and form no strata.
    """
    r = np.exp(log_ratios)
    times = weights if times is None else times
    if not (weights.size == times.size == r.size == strata.size) or not (
        np.all(weights > 0) and np.all(times > 0)
    ):
        raise BadInputError("paired estimate", "every pair needs positive tokens and time")
    labels = np.unique(strata)
    means, sizes, shares = [], [], []
    residuals = np.empty_like(r)
    for s in labels:
        idx = strata == s
        w = weights[idx]
        m = float((w * r[idx]).sum() / w.sum())
        means.append(m)
        sizes.append(float(times[idx].mean()))  # the stratum's time (or tokens) a block
        shares.append(float(((w / w.sum()) ** 2).sum()))
        residuals[idx] = r[idx] - m
    u = np.array(sizes) / sum(sizes)
    ratio = float((u * np.array(means)).sum())
    df = r.size - labels.size
    sigma2 = float((residuals**2).sum()) / df
    se = math.sqrt(sigma2 * float((u**2 * np.array(shares)).sum()))
    return ratio, se / ratio, df


def disturbed(log_ratios: np.ndarray) -> tuple[int, ...]:
    """The pairs to set aside as disturbed: of the ``n // SET_ASIDE_PER`` pairs farthest from
    the median (none below :data:`SET_ASIDE_PER` pairs), those that lie more than
    :data:`DISTURBED_SDS` standard deviations of the other pairs from the other pairs' mean.

    Only for a cell whose blocks all send the same prompts
    (:attr:`spectool.decide.paired.PairedCell.same_prompts`): there a pair's ratio differs
    from the others' by the machine and the harness alone, and one block that ran far off
    every other is noise, not a fact of the workload; the t interval of the mean would carry
    it at full weight and flip the verdict. The main job's concurrency-16 cell, 2026-12-05,
    twice: a baseline block at 21.7 (26.1) ms per token among 31-38, pair ratio 1.44 (1.21)
    among 0.86-0.98. Its wall time and engine time were its neighbours'; for 0.8 s its new
    requests were not admitted (the engine decoded the batch without their prefills, then
    prefilled six at once), so time moved from the users' TPOT into their TTFT (mean 361
    (414) ms against 100-176). Where blocks send different prompts, a far-off pair may be its
    prompts (n-gram on a repetitive one), which the workload's mean must count, so nothing is
    set aside. The others' standard deviation, not the median absolute deviation: on 8 pairs
    three alike make that collapse (a run's 0.99 among 0.86-0.95 was set aside by it). The
    threshold keeps the t interval's coverage (seeded simulation, 20,000 cells of 8 pairs, at
    the main job's last look, 95.8% nominal): on normal pairs it sets one aside in 1.1% of
    cells and the interval over the rest covers in 95.2%; with one pair in a quarter of the
    cells shifted 7-17 standard deviations, 95.1%, at 55% of the width of the interval over
    every pair (``tests/decide/test_paired.py`` checks both on fewer cells).
    """
    n = log_ratios.size
    most = n // SET_ASIDE_PER
    if most < 1:
        return ()
    far = np.abs(log_ratios - float(np.median(log_ratios)))
    candidates = np.argsort(-far, kind="stable")[:most]
    rest = np.delete(log_ratios, candidates)
    scale = float(rest.std(ddof=1))
    if scale <= 0.0:
        return ()
    centre = float(rest.mean())
    return tuple(
        sorted(int(i) for i in candidates if abs(log_ratios[i] - centre) > DISTURBED_SDS * scale)
    )


def weighted_ratio(log_ratios: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """The weighted mean of ``exp(log_ratios)`` and the standard error of its log.

    The standard error is the weighted mean's between-pairs one, ``sqrt(n / (n - 1) *
    sum(w_i^2 (r_i - mean)^2))`` with weights summing to 1, read on the log scale through the
    mean (delta method). Equal weights give the ordinary ``sd(r) / sqrt(n)``.
    """
    r = np.exp(log_ratios)
    if weights.size != r.size or not np.all(weights > 0):
        raise BadInputError("paired estimate", "every pair needs a positive weight")
    w = weights / weights.sum()
    mean = float((w * r).sum())
    n = r.size
    se = math.sqrt(n / (n - 1) * float((w**2 * (r - mean) ** 2).sum())) if n > 1 else 0.0
    return mean, se / mean
