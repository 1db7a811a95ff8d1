"""The choice from measured cells (step 6 of :mod:`spectool.decide.tune`): rank the cells that
pay, and pick the best draft lengths a TensorRT-LLM schedule can write."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from spectool.decide.acceptance import (
    PositionCounts,
    constant_alpha_for,
    expected_tokens_per_step,
    leviathan_expected_tokens,
)
from spectool.decide.cell import CellMeasurement
from spectool.decide.result import CellKey
from spectool.decide.verdict import CellVerdict, proven_tie


def ranking_ratios(
    cells: Mapping[CellKey, CellMeasurement], verdicts: Sequence[CellVerdict]
) -> dict[CellKey, float]:
    """Per speculative cell, the ratio used to rank the cells that pay at one concurrency.

    ``c_k / E_pooled[tokens | k]``: the cell's measured step cost ratio over the tokens per step
    predicted from acceptance pooled over every cell measured at that concurrency. For a chain
    drafter acceptance at a position does not depend on ``k``, so pooling removes most of the
    sampling noise that makes cells a few percent apart swap places; the step cost is measured
    precisely. Acceptance is pooled from per-position counts where the engine gives them, else
    as a constant ``alpha`` (each cell's measured tokens per step inverted through Leviathan's
    form, weighted by request-steps). A cell's own ratio where neither exists.
    """
    counts_at: dict[int, PositionCounts] = {}
    alpha_sums: dict[int, list[float]] = {}  # concurrency -> [sum of w * alpha, sum of w]
    for (c, k), cell in sorted(cells.items()):
        if k == 0:
            continue
        if cell.positions is not None:
            counts_at[c] = counts_at[c].merged(cell.positions) if c in counts_at else cell.positions
            continue
        tokens = cell.tokens_per_step()
        if tokens is not None:
            weight = float(sum(s.batch_size for s in cell.iterations) or 1)
            alpha = constant_alpha_for(min(max(tokens, 1.0), k + 1.0), k)
            acc = alpha_sums.setdefault(c, [0.0, 0.0])
            acc[0] += weight * alpha
            acc[1] += weight
    ranking: dict[CellKey, float] = {}
    for v in verdicts:
        key = (v.concurrency, v.k)
        counts = counts_at.get(v.concurrency)
        tokens_pooled: float | None = None
        if counts is not None and counts.steps and counts.max_draft_len >= v.k:
            tokens_pooled = expected_tokens_per_step(counts.alphas(), v.k)
        elif v.concurrency in alpha_sums:
            total, weight = alpha_sums[v.concurrency]
            tokens_pooled = leviathan_expected_tokens(total / weight, v.k)
        if v.step_cost_ratio is None or tokens_pooled is None:
            ranking[key] = v.ratio
        else:
            ranking[key] = v.step_cost_ratio / tokens_pooled
    return ranking


class _Judged(Protocol):
    """A measured cell's verdict and estimate (a :class:`CellVerdict` or a method's cell)."""

    @property
    def verdict(self) -> str: ...

    @property
    def ratio(self) -> float: ...

    @property
    def ci_low(self) -> float: ...

    @property
    def ci_high(self) -> float: ...


def unproven_gain(v: _Judged, min_gain: float = 0.0) -> bool:
    """Whether ``v`` is *uncertain*: inconclusive, its estimate below 1 (below ``1 - min_gain``),
    and no tie with off proven (its interval is wider than ``1 +- TIE_MARGIN``). The budget ran
    out before the interval settled; the better estimate is deployed, reported as uncertain
    (issue 21: a tie is proven, never assumed; only a proven one goes to off, the cheaper)."""
    return (
        v.verdict == "inconclusive"
        and v.ratio < 1.0 - min_gain
        and not proven_tie(v.ci_low, v.ci_high)
    )


def final_choices(
    concurrencies: Sequence[int],
    verdicts: Sequence[CellVerdict],
    ranking: Mapping[CellKey, float],
    min_gain: float,
    accept_inconclusive: bool,
    *,
    cap: bool = True,
) -> dict[int, int]:
    """The draft length per concurrency, from measured cells that pay.

    Without ``cap``: at each concurrency the best-ranked eligible cell, else 0. With ``cap`` the
    choices must be writable as a TensorRT-LLM schedule, i.e. none above the choice at the
    smallest concurrency (which becomes ``max_draft_len``). Every eligible first choice ``k1``
    (and 0) is tried, each other concurrency takes its best eligible cell with ``k <= k1``, and
    the set with the lowest sum of ranking ratios (1 for "off") over concurrencies wins, ties to
    the smaller ``k1``: concurrencies count equally, since the traffic mix is unknown.

    Eligible cells: those that pay, and *uncertain* ones (:func:`unproven_gain`): inconclusive,
    with an estimate that beats off, and no tie with off proven. Such a cell's budget ran out
    before its interval cleared 1; left off, the gain is lost and the verdict hangs on whether
    the interval happened to clear 1 (the main job's concurrency-16 cell: 0.83-0.93 in four
    runs, on in two). Only a tie proven within :data:`~spectool.decide.verdict.TIE_MARGIN`
    goes to off, as fast and cheaper to serve. ``accept_inconclusive`` makes every
    inconclusive cell below 1 eligible, proven ties too.

    The smallest concurrency's choice gates every other one, so when no cell pays there, an
    ``inconclusive`` one whose ratio is below ``1 - min_gain`` is tried as ``k1`` too, but only
    in sets where some larger concurrency then uses a cell that pays: otherwise one noisy interval at the smallest
    concurrency would switch speculation off everywhere, also where it measurably pays (on a
    CPU, where drafting overhead weighs most at batch 1, that is the usual case).
    """

    def eligible(v: CellVerdict) -> bool:
        if v.ratio >= 1.0 - min_gain:
            return False
        if v.verdict == "pays" or unproven_gain(v, min_gain):
            return True
        return accept_inconclusive and v.verdict == "inconclusive"

    scores: dict[int, dict[int, float]] = {c: {} for c in concurrencies}
    for v in verdicts:
        if v.concurrency in scores and eligible(v):
            scores[v.concurrency][v.k] = ranking[(v.concurrency, v.k)]

    def best_up_to(c: int, limit: int | None) -> tuple[int, float]:
        options = [(score, k) for k, score in scores[c].items() if limit is None or k <= limit]
        score, k = min(options, default=(1.0, 0))
        return k, score

    if not cap:
        return {c: best_up_to(c, None)[0] for c in concurrencies}
    first, rest = concurrencies[0], concurrencies[1:]
    enabling = {
        v.k: ranking[(v.concurrency, v.k)]
        for v in verdicts
        if v.concurrency == first and v.verdict == "inconclusive"
    }

    def option(k1: int, first_score: float) -> tuple[float, float, int, dict[int, int]]:
        """(total, total over the other concurrencies, k1, choices) with ``k1`` first."""
        choices = {first: k1}
        rest_total = 0.0
        for c in rest:
            k, score = best_up_to(c, k1) if k1 > 0 else (0, 1.0)
            choices[c] = k
            rest_total += score
        return first_score + rest_total, rest_total, k1, choices

    # Ties go to the smaller k1 (tuples compare the total, then the rest, then k1).
    best = min(option(k1, scores[first].get(k1, 1.0)) for k1 in {0, *scores[first]})
    for k1, first_score in sorted(enabling.items()):
        total, rest_total, _, choices = candidate = option(k1, first_score)
        # An undecided first cell must earn its place: it has to let the other concurrencies
        # do better than any first choice that pays, and win on the whole.
        if any(choices[c] > 0 for c in rest) and rest_total < best[1] and total < best[0]:
            best = candidate
    return best[3]
