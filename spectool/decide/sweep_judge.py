"""Judging a choice against a brute-force sweep that is itself measured, not known.

A sweep measures every configuration (every method at every draft length, and the baseline)
a few rounds. Its best configuration is the largest of many noisy means, so it is biased
upwards: on the built-in workload at concurrency 4 (three rounds on the 2-core machine under
other jobs), draft_model k=2 averaged 69 tokens/s per user from rounds of 90, 61 and 55 and
k=4 61 from 61, 64 and 58; the "best" of seventeen such means beat a choice by 13 % that no
round but the first told apart. Holding a choice to 95 % of that maximum measures the sweep's
luck as much as the choice. So the judgment here is made of three figures:

* **in sample** (what the issue's bar reads): the choice's mean over the best mean;
* **held out**: for each round, the best configuration is picked on the *other* rounds and
  both are read in this one (leave one round out); the share is the geometric mean over
  rounds. A lucky round cannot both crown a configuration and score it, so the winner's curse
  is gone (the held-out best can then be worse than the choice: shares above 1 are kept);
* **its interval**: the paired per-round log-shares against the in-sample best (same round,
  same minutes) give a t interval; where its top is below the bar the choice is *proven* short.

Beside them, the sweep's own repeatability (:func:`split_half`): the best of half its rounds
judged on the other half. On issue 21's code and prose sweeps (4 rounds, 2026-12-04) that
reached 95 % in 27 of 36 (concurrency x split) cells: a rough ceiling for any tuner judged
this way.

A round's figure for a configuration is its per-user tokens/s over the baseline blocks that
bracket it in that round (:func:`bracketed_speedups`), so a round on a slower machine does not
pull every configuration down together and swap their order with the rounds that ran fast.

Pure: means in, figures out.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats

from spectool.errors import BadInputError

BASE = "base"


def bracketed_speedups(blocks: Sequence[tuple[str, float]]) -> dict[str, float]:
    """One round's speed-ups: each configuration's per-user tokens/s over the mean of the
    nearest baseline block before it and after it (the one there is at an end).

    ``blocks`` are ``(name, tokens/s)`` in the order run; ``BASE`` blocks are the baseline.
    The baseline itself scores 1."""
    bases = [i for i, (name, _) in enumerate(blocks) if name == BASE]
    if not bases:
        raise BadInputError("sweep round", "no baseline block to compare the others with")
    out: dict[str, float] = {BASE: 1.0}
    for i, (name, rate) in enumerate(blocks):
        if name == BASE:
            continue
        before = [blocks[j][1] for j in bases if j < i][-1:]
        after = [blocks[j][1] for j in bases if j > i][:1]
        near = before + after
        out[name] = rate / (sum(near) / len(near))
    return out


@dataclass(frozen=True)
class SweepJudgment:
    """A choice against a sweep of ``rounds`` rounds (see the module docstring)."""

    chosen: str
    best: str  # in sample
    share: float  # in sample: the choice's mean over the best mean
    heldout_share: float
    low: float  # t interval of the share against the in-sample best, per-round pairs
    high: float
    rounds: int

    def verdict(self, quality: float) -> str:
        """``holds`` (in sample at the bar), ``within noise`` (held out at the bar and the
        interval reaching it), or ``short`` (below the bar, held out or proven)."""
        if self.share >= quality:
            return "holds"
        if self.heldout_share >= quality and self.high >= quality:
            return "within noise"
        return "short"


def judge(
    rounds: Sequence[Mapping[str, float]], chosen: str, *, confidence: float = 0.9
) -> SweepJudgment:
    """``chosen`` against the sweep whose round ``i`` scored the configurations ``rounds[i]``
    (higher is better: tokens/s, or speed-ups over the round's baseline)."""
    if not rounds:
        raise BadInputError("sweep", "no rounds to judge against")
    names = set(rounds[0])
    if any(set(r) != names for r in rounds) or chosen not in names:
        raise BadInputError("sweep", f"every round must score every configuration and {chosen}")

    def mean(name: str, skip: int | None = None) -> float:
        values = [r[name] for i, r in enumerate(rounds) if i != skip]
        return sum(values) / len(values)

    best = max(sorted(names), key=mean)
    share = mean(chosen) / mean(best)
    n = len(rounds)
    if n > 1:
        logs = []
        for i, r in enumerate(rounds):
            fold_best = max(sorted(names), key=lambda name, i=i: mean(name, skip=i))
            logs.append(math.log(r[chosen] / r[fold_best]))
        heldout = math.exp(sum(logs) / n)
    else:
        heldout = share
    paired = [math.log(r[chosen] / r[best]) for r in rounds]
    centre = sum(paired) / n
    if n > 1:
        sd = math.sqrt(sum((x - centre) ** 2 for x in paired) / (n - 1))
        half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    else:
        half = math.inf
    return SweepJudgment(
        chosen=chosen,
        best=best,
        share=share,
        heldout_share=heldout,
        low=math.exp(centre - half),
        high=math.exp(centre + half) if math.isfinite(half) else math.inf,
        rounds=n,
    )


def heldout_gain(rounds: Sequence[Mapping[str, float]]) -> float:
    """The best configuration's gain over the baseline, free of the winner's curse: for each
    round, the configuration with the best mean on the *other* rounds, read in this one against
    the baseline; the geometric mean over rounds. The in-sample best's gain is the largest of
    many noisy means: on 2026-12-05 the built-in workload's sweep put draft_model k=2 at
    concurrency 4 at 1.10x in sample (8 rounds), where 16 interleaved rounds of that
    configuration alone read 1.05x. The issue's on/off bar (agree where the best differs from
    the baseline by more than 5 %) is read both ways. One round: the in-sample gain."""
    if not rounds:
        raise BadInputError("sweep", "no rounds to judge against")
    names = sorted(rounds[0])

    def mean(name: str, skip: int | None) -> float:
        values = [r[name] for i, r in enumerate(rounds) if i != skip]
        return sum(values) / len(values)

    if len(rounds) == 1:
        best = max(names, key=lambda name: mean(name, None))
        return rounds[0][best] / rounds[0][BASE]
    logs = []
    for i, r in enumerate(rounds):
        fold_best = max(names, key=lambda name, i=i: mean(name, i))
        logs.append(math.log(r[fold_best] / r[BASE]))
    return math.exp(sum(logs) / len(logs))


@dataclass(frozen=True)
class SplitHalf:
    """The sweep's own repeatability (:func:`split_half`): how often the best configuration of
    half its rounds reaches ``quality`` of the best on the other half."""

    reached: int
    splits: int
    median_share: float
    worst_share: float


MAX_SPLITS = 252  # every split of 10 rounds


def _splits(n: int, half: int) -> list[tuple[int, ...]]:
    """Every way to pick ``half`` of ``n`` rounds, or :data:`MAX_SPLITS` of them drawn with a
    fixed seed (sorted, distinct) when there are more."""
    if math.comb(n, half) <= MAX_SPLITS:
        return list(itertools.combinations(range(n), half))
    rng = random.Random(0)  # noqa: S311 (a reproducible draw, not a secret)
    picked: set[tuple[int, ...]] = set()
    while len(picked) < MAX_SPLITS:
        picked.add(tuple(sorted(rng.sample(range(n), half))))
    return sorted(picked)


def split_half(rounds: Sequence[Mapping[str, float]], quality: float) -> SplitHalf | None:
    """For every way to split the rounds into two halves (``n // 2`` rounds each; the odd one
    out sits out), the configuration with the best mean on one half, judged in sample on the
    other (:func:`judge`'s ``share``): what a brute-force sweep of half the rounds would have
    chosen, held to the bar a tuner is held to: how often a choice as good as the sweep's
    own best misses that bar. A rough ceiling, since the reference here has half the rounds
    the real judgment has (a noisier reference misses more). None with fewer than 2 rounds.
    Past :data:`MAX_SPLITS` ways (more than 10 rounds), that many drawn at random with a fixed
    seed: 24 rounds have 2.7 million."""
    n = len(rounds)
    if n < 2:
        return None
    half = n // 2
    shares = []
    for picked in _splits(n, half):
        rest = [i for i in range(n) if i not in picked][:half]
        mean = {name: sum(rounds[i][name] for i in picked) / half for name in sorted(rounds[0])}
        choice = max(mean, key=lambda name: mean[name])
        shares.append(judge([rounds[i] for i in rest], choice).share)
    shares.sort()
    return SplitHalf(
        reached=sum(x >= quality for x in shares),
        splits=len(shares),
        median_share=shares[len(shares) // 2],
        worst_share=shares[0],
    )


def deployable_best(
    scores: Mapping[str, Sequence[Mapping[str, float]]],
) -> tuple[str, dict[str, str]]:
    """The best deployment a sweep finds that a deployment can run: one method, with its own
    draft length per concurrency (a ``draft_len_schedule`` switches ``k``, never methods).
    ``scores`` maps each concurrency to its rounds' speed-ups per configuration (``"METHOD
    k=K"``, and :data:`BASE` at 1). Per method and concurrency its best mean configuration, or
    the baseline where that is faster; the method whose schedule has the highest geometric
    mean of mean speed-ups over the concurrencies wins (ties: the name). Returns the method and
    its configuration per concurrency. (A schedule also caps later concurrencies' ``k`` at
    the first one's; this reference does not, so it can only be stricter.)"""
    if not scores:
        raise BadInputError("sweep", "no concurrencies to judge against")

    def mean(rounds: Sequence[Mapping[str, float]], name: str) -> float:
        return sum(r[name] for r in rounds) / len(rounds)

    names = {n for rounds in scores.values() for n in rounds[0]}
    methods = sorted({n.split(" k=")[0] for n in names if n != BASE})
    if not methods:
        raise BadInputError("sweep", "no speculative configuration to judge against")
    plans: dict[str, dict[str, str]] = {}
    for method in methods:
        plan = {}
        for c, rounds in scores.items():
            own = [n for n in rounds[0] if n.split(" k=")[0] == method] + [BASE]
            plan[c] = max(sorted(own), key=lambda n, rounds=rounds: mean(rounds, n))
        plans[method] = plan

    def log_score(method: str) -> float:
        return sum(
            math.log(mean(scores[c], n) / mean(scores[c], BASE)) for c, n in plans[method].items()
        )

    best = max(methods, key=lambda m: (log_score(m), m))
    return best, plans[best]
