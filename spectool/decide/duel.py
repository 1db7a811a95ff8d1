"""Two methods head to head: their chosen cells measured in the same window on the same prompts.

Why: each method's search compares it with the baseline in its own window, so two methods'
ratios come from windows minutes apart, and their difference carries whatever changed in
between that the pairing against the baseline did not cancel. Where the method comparison
(:mod:`spectool.decide.methods`) cannot tell the best method from the runner-up, the two run
head to head: pair ``i`` is a block of method ``a`` at its chosen ``k`` and a block of method
``b`` at its chosen ``k``, back to back, on the same prompts, in the order a b, b a, ... (the
blocks walk the same shuffled passes over the workload as every paired cell). Each pair gives
``d_i = log(ms_per_token_a / ms_per_token_b)`` (both blocks' iterations when both have them,
else their requests): a change of the machine's speed between pairs cancels in it.

Estimate: the workload's time with ``a`` over its time with ``b``, the mean of the pairs'
ratios ``exp(d_i)`` weighted by ``b``'s time on each pair's prompts (its tokens times its time
per token; :func:`spectool.decide.pair_stats.fit_pairs`): ``b``'s cost per token depends on the
prompt as much as ``a``'s (acceptance does), and by tokens alone a prompt where ``b`` is slow
weighed like one where it is fast (prose, n-gram against a draft model at concurrency 1, 24
pairs in 8 strata, two runs: 0.988 and 0.979 by tokens, 0.944 and 0.897 by time). With the
standard error of its log between pairs (:func:`spectool.decide.pair_stats.weighted_ratio`);
where every block sent the same prompts (then weighed by tokens), without the pairs set aside as disturbed
(:func:`spectool.decide.pair_stats.disturbed`); where the pairs fall into several strata of the
same prompts, each measured twice or more, the strata's estimate
(:func:`spectool.decide.pair_stats.stratified_ratio`). A head-to-head cell is
*decided* once the two one-sided tests prove the methods equivalent within ``1 +- margin``, or
the two-sided interval lies wholly on one side of 1 (t quantiles with ``n - 1`` degrees of
freedom, Bonferroni-corrected over the looks the cell may take).

Pure: blocks in, estimates out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spectool.decide.cell import CellMeasurement
from spectool.decide.cost import source_terms
from spectool.decide.pair_stats import fit_pairs
from spectool.decide.verdict import Source, objective_source
from spectool.errors import BadInputError

MIN_PAIRS = 2


@dataclass(frozen=True)
class DuelPair:
    """A block of method ``a`` and a block of method ``b`` measured beside it (same prompts)."""

    a: CellMeasurement
    b: CellMeasurement
    a_first: bool = True

    def __post_init__(self) -> None:
        if self.a.concurrency != self.b.concurrency or min(self.a.k, self.b.k) < 1:
            raise BadInputError(
                f"head-to-head pair (concurrency={self.a.concurrency})",
                "need two speculative blocks at the same concurrency",
            )


@dataclass(frozen=True)
class DuelEstimate:
    """Method ``a``'s time per token over method ``b``'s at one concurrency, measured head to
    head: ``ratio`` below 1 means ``a`` is faster. ``log_se`` is the standard error of
    ``log(ratio)`` between pairs; ``t`` the quantile its interval uses (``n - 1`` degrees of
    freedom at the confidence the caller asked for, corrected for the looks)."""

    concurrency: int
    methods: tuple[str, str]
    ks: tuple[int, int]
    ratio: float
    log_se: float
    log_ratios: tuple[float, ...]
    prompts_covered: int = 0
    workload_prompts: int = 0
    source: Source = "iterations"
    set_aside: tuple[int, ...] = ()  # pairs set aside as disturbed (pair_stats.disturbed)
    df: int = 0  # degrees of freedom of log_se (0: pairs - 1)
    strata: int = 0  # strata of the same prompts the estimate used (0: between pairs)

    @property
    def pairs(self) -> int:
        """The pairs the estimate stands on (those set aside not counted)."""
        return len(self.log_ratios) - len(self.set_aside)

    @property
    def dof(self) -> int:
        """The degrees of freedom of ``log_se``: pairs less strata, or pairs less one."""
        return self.df or max(self.pairs - 1, 1)

    def interval(self, quantile: float) -> tuple[float, float]:
        """``ratio`` times and over ``exp(quantile * log_se)``."""
        half = quantile * self.log_se
        return self.ratio * math.exp(-half), self.ratio * math.exp(half)

    def to_json(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "methods": list(self.methods),
            "k": list(self.ks),
            "ratio": self.ratio,
            "log_se": self.log_se,
            "pairs": self.pairs,
            "pair_ratios": [math.exp(d) for d in self.log_ratios],
            "prompts_covered": self.prompts_covered,
            "workload_prompts": self.workload_prompts,
            "source": self.source,
            "set_aside": list(self.set_aside),
            "strata": self.strata,
        }


def _ms_and_tokens(cell: CellMeasurement, source: Source) -> tuple[float, float]:
    num, den = source_terms(cell, source)
    if den.size == 0 or den.sum() <= 0:
        raise BadInputError(
            f"head-to-head block (concurrency={cell.concurrency}, k={cell.k})",
            f"no {source} to measure",
        )
    return float(num.sum() / den.sum()), float(den.sum())


def duel_estimate(
    pairs: Sequence[DuelPair],
    methods: tuple[str, str],
    *,
    prompts_covered: int = 0,
    workload_prompts: int = 0,
    objective: str = "steps",
    strata: Sequence[int] = (),
) -> DuelEstimate:
    """The head-to-head estimate from ``pairs`` (at least :data:`MIN_PAIRS`), comparing what
    ``objective`` compares (:data:`~spectool.decide.verdict.OBJECTIVES`), as the cells did.
    ``strata``: per pair, its stratum of the same prompts (:attr:`spectool.decide.paired.
    PairedCell.strata`): with one, a far-off pair is set aside as disturbed
    (:func:`~spectool.decide.pair_stats.disturbed`); with several of two pairs or more, the
    estimate is the strata's (:func:`~spectool.decide.pair_stats.stratified_ratio`)."""
    if strata and len(strata) != len(pairs):
        raise BadInputError("head-to-head", f"{len(strata)} strata for {len(pairs)} pairs")
    if len(pairs) < MIN_PAIRS:
        raise BadInputError("head-to-head", f"need {MIN_PAIRS} pairs, got {len(pairs)}")
    c = pairs[0].a.concurrency
    ks = (pairs[0].a.k, pairs[0].b.k)
    if any((p.a.concurrency, p.a.k, p.b.k) != (c, *ks) for p in pairs):
        raise BadInputError("head-to-head", "pairs of different cells")
    source: Source = objective_source(objective) or (
        "iterations" if all(p.a.iterations and p.b.iterations for p in pairs) else "requests"
    )
    logs, tokens, times = [], [], []
    for p in pairs:
        ms_a, _ = _ms_and_tokens(p.a, source)
        ms_b, tok = _ms_and_tokens(p.b, source)
        logs.append(math.log(ms_a / ms_b))
        tokens.append(tok)
        times.append(ms_b * tok)  # b's time on the pair's tokens (module docstring)
    fit = fit_pairs(np.array(logs), np.array(tokens), strata, np.array(times))
    return DuelEstimate(
        concurrency=c,
        methods=methods,
        ks=ks,
        ratio=fit.ratio,
        log_se=fit.log_se,
        log_ratios=tuple(logs),
        prompts_covered=prompts_covered,
        workload_prompts=workload_prompts,
        source=source,
        set_aside=fit.set_aside,
        df=fit.df,
        strata=fit.strata,
    )


def quantiles(df: int, confidence: float, looks: int = 1) -> tuple[float, float]:
    """``(one-sided, two-sided)`` t quantiles on ``df`` degrees of freedom (an estimate's
    :attr:`DuelEstimate.dof`) at ``confidence``, each look at confidence ``1 - (1 -
    confidence) / looks``."""
    from scipy import stats

    alpha = (1.0 - confidence) / looks
    df = max(df, 1)
    return float(stats.t.ppf(1.0 - alpha, df)), float(stats.t.ppf(1.0 - alpha / 2.0, df))


def proven_faster(estimate: DuelEstimate, *, confidence: float, looks: int = 1) -> bool:
    """Whether the first method is proven faster: the two-sided interval of its ratio over the
    second's lies wholly below 1 (the test :func:`decided` calls *proven different*)."""
    _, two = quantiles(estimate.dof, confidence, looks)
    return estimate.interval(two)[1] < 1.0


def decided(estimate: DuelEstimate, *, confidence: float, margin: float, looks: int = 1) -> bool:
    """Whether the head-to-head cell is settled: proven equivalent within ``1 +- margin`` (two
    one-sided tests) or proven different (the two-sided interval clear of 1)."""
    one, two = quantiles(estimate.dof, confidence, looks)
    low, high = estimate.interval(one)
    if 1.0 / (1.0 + margin) <= low and high <= 1.0 + margin:
        return True
    low2, high2 = estimate.interval(two)
    return high2 < 1.0 or low2 > 1.0
