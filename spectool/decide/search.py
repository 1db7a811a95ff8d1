"""The search's plan: which cells to measure first, what the predictions ask to confirm, and
in which order (steps 1-5 of :mod:`spectool.decide.tune`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from spectool.decide.acceptance import PositionCounts, constant_alpha_for
from spectool.decide.cell import CellMeasurement
from spectool.decide.cost import request_terms
from spectool.decide.model import CellPrediction, StepCostObservation, observation_from_cell
from spectool.decide.result import CellKey


def spread(concurrencies: Sequence[int], n: int) -> tuple[int, ...]:
    """``n`` concurrencies evenly spread over the sorted list (ends included)."""
    values = sorted(set(concurrencies))
    if n >= len(values):
        return tuple(values)
    idx = np.unique(np.round(np.linspace(0, len(values) - 1, max(n, 1))).astype(int))
    return tuple(values[i] for i in idx)


def initial_plan(
    concurrencies: Sequence[int],
    max_draft_len: int,
    *,
    acceptance_concurrencies: int = 2,
    cost_concurrencies: int = 1,
    prior: bool = False,
) -> tuple[CellKey, ...]:
    """Cells measured before any prediction: baselines, ``K`` at ``acceptance_concurrencies``
    spread concurrencies (ends first), then ``1`` at ``cost_concurrencies`` spread ones (one: the
    smallest). Grouped by ``k``: three server starts. ``prior``: a first-principles step cost
    stands in for the ``k = 1`` cells (when ``K > 1``), so they are not planned."""
    plan: list[CellKey] = [(c, 0) for c in sorted(set(concurrencies))]
    plan += [(c, max_draft_len) for c in spread(concurrencies, acceptance_concurrencies)]
    if not (prior and max_draft_len > 1):
        plan += [(c, 1) for c in spread(concurrencies, cost_concurrencies)]
    return tuple(dict.fromkeys(plan))


def base_step_ms(cell: CellMeasurement) -> float | None:
    step = cell.mean_step_ms()
    if step is not None:
        return step
    num, den = request_terms(cell.records)
    return float(num.sum() / den.sum()) if den.size else None


@dataclass(frozen=True)
class Baselines:
    """What the predictions compare with, per concurrency (:func:`prediction_baselines`)."""

    step_ms: dict[int, float]
    batch: dict[int, float]
    stall_ms: dict[int, float]  # per decode token, the wait through other requests' prefills
    observations: tuple[StepCostObservation, ...]  # the k = 0 observations of the cost model
    paired: tuple[int, ...]  # concurrencies whose baseline is the paired blocks'
    scale: float  # the other concurrencies' planning baselines times this (1.0: none)


def stall_ms(cell: CellMeasurement) -> float:
    """Per decode token, what a request waited beyond the engine's steps: its time per output
    token (``E2E - TTFT`` over tokens) less the mean step, when both are measured (0
    otherwise, and never below 0). On a closed loop at concurrency ``c`` that is mostly the
    other requests' prefills run while it decodes: the same with speculation or without."""
    step = cell.mean_step_ms()
    num, den = request_terms(cell.records)
    if step is None or not den.size or not den.sum() > 0:
        return 0.0
    return max(0.0, float(num.sum() / den.sum()) - step)


def prediction_baselines(
    planning: Mapping[int, CellMeasurement],
    paired: Mapping[int, CellMeasurement],
    *,
    stalls: bool,
) -> Baselines:
    """Per concurrency, the baseline the predicted ratios are taken against: the baseline
    blocks of the plan's paired cells there (``paired``), measured beside the speculative
    blocks whose step times the cost model fits, so the model's extra cost and its baseline are
    of the same minutes and the same switching; elsewhere the planning baseline (``planning``),
    scaled by the geometric mean of paired over planning step at the concurrencies that have
    both (the machine moved between the planning trial and the pairs: 0.89-1.26 in three main
    jobs of 2026-12-05). ``stalls``: also each baseline's prefill stall per token
    (:func:`stall_ms`; for request-time objectives, which see it)."""
    chosen: dict[int, tuple[CellMeasurement, float]] = {}
    logs = []
    for c, cell in paired.items():
        step, plan_step = base_step_ms(cell), base_step_ms(planning[c]) if c in planning else None
        if step is not None and plan_step:
            logs.append(math.log(step / plan_step))
    scale = math.exp(sum(logs) / len(logs)) if logs else 1.0
    for c, cell in planning.items():
        chosen[c] = (paired[c], 1.0) if c in paired else (cell, scale)
    steps, batch, stall, obs = {}, {}, {}, []
    for c, (cell, f) in sorted(chosen.items()):
        observed = observation_from_cell(cell)  # a baseline's: its step, or its time per token
        if observed is None:
            continue
        obs.append(replace(observed, step_ms=observed.step_ms * f))
        steps[c] = obs[-1].step_ms
        stall[c] = stall_ms(cell) * f if stalls else 0.0
        if (b := cell.mean_batch_size()) is not None:
            batch[c] = b
    return Baselines(
        steps, batch, stall, tuple(obs), tuple(sorted(c for c in paired if c in planning)), scale
    )


def alphas_by_concurrency(
    cells: Mapping[CellKey, CellMeasurement], concurrencies: Sequence[int], k_max: int
) -> dict[int, tuple[float, ...]]:
    """Per-position acceptance for every concurrency, from the nearest one that measured it."""
    measured: dict[int, tuple[float, ...]] = {}
    for c in concurrencies:
        pooled: PositionCounts | None = None
        for k in range(1, k_max + 1):
            cell = cells.get((c, k))
            if cell is not None and cell.positions is not None:
                pooled = cell.positions if pooled is None else pooled.merged(cell.positions)
        if pooled is not None and pooled.max_draft_len >= k_max and pooled.steps:
            measured[c] = pooled.alphas()[:k_max]
            continue
        top = cells.get((c, k_max))
        tokens = None if top is None else top.tokens_per_step()
        if tokens is not None:
            alpha = constant_alpha_for(min(max(tokens, 1.0), k_max + 1.0), k_max)
            measured[c] = (alpha,) * k_max
    if not measured:
        return {}
    return {
        c: measured[min(measured, key=lambda a: (abs(math.log(a / c)), a))] for c in concurrencies
    }


def speculative_batches(
    cells: Mapping[CellKey, CellMeasurement], concurrencies: Sequence[int], max_draft_len: int
) -> dict[CellKey, float]:
    """Expected mean decode batch of every speculative cell, from the measured cells.

    In a closed loop of ``c`` clients the decode batch is ``c`` less the requests waiting for or in
    prefill; speculation makes requests finish in fewer steps, so newcomers (and their prefills)
    come more often and the batch shrinks: 15.5 without speculation against 8.0 with k=8 at
    concurrency 16 on the embedded engine. The shrink is measured as ``batch(c, k) / batch(c, 0)``
    wherever both cells exist, taken piecewise-linearly in ``k`` (1 at ``k = 0``, held beyond
    the largest measured ``k``), and interpolated linearly in ``log c`` between measured
    concurrencies (held beyond the ends). Concurrencies without a baseline batch are left out
    (the prediction then uses the concurrency itself).
    """
    base = {
        c: b
        for c in concurrencies
        if (cell := cells.get((c, 0))) is not None and (b := cell.mean_batch_size())
    }
    shrink: dict[int, list[tuple[int, float]]] = {}
    for (c, k), cell in sorted(cells.items()):
        batch = cell.mean_batch_size()
        if k > 0 and c in base and batch is not None:
            shrink.setdefault(c, [(0, 1.0)]).append((k, batch / base[c]))
    if not shrink:
        return {}

    def at(c: int, k: int) -> float:
        points = shrink[c]
        return float(np.interp(k, [p[0] for p in points], [p[1] for p in points]))

    measured = sorted(shrink)
    logs = [math.log(c) for c in measured]
    out: dict[CellKey, float] = {}
    for k in range(1, max_draft_len + 1):
        at_k = [at(m, k) for m in measured]
        for c, batch in base.items():
            out[(c, k)] = max(1.0, batch * float(np.interp(math.log(c), logs, at_k)))
    return out


def predicted_writable_first(
    predictions: Sequence[CellPrediction], concurrencies: Sequence[int]
) -> int:
    """The first concurrency's draft length that the predictions say is best for the whole
    schedule: no concurrency may use more (it is ``max_draft_len``), so for each candidate
    ``k1`` every other concurrency takes its best predicted ``k <= k1`` (or off, ratio 1) and
    the lowest sum of predicted ratios wins (ties to the smaller ``k1``; 0 = off)."""
    pred = {(p.concurrency, p.k): p.ratio for p in predictions if p.k > 0}
    first, rest = concurrencies[0], concurrencies[1:]

    def total(k1: int) -> float:
        if k1 == 0:
            return float(len(concurrencies))
        return pred.get((first, k1), math.inf) + sum(
            min([1.0] + [r for (c2, k), r in pred.items() if c2 == c and k <= k1]) for c in rest
        )

    return min([0, *sorted({k for c, k in pred if c == first})], key=lambda k1: (total(k1), k1))


def confirmation_cells(
    predictions: Sequence[CellPrediction],
    close_margin: float,
    *,
    measured: set[CellKey] | frozenset[CellKey] = frozenset(),
    shorter: bool = False,
) -> list[CellKey]:
    """One cell per concurrency to measure, with as few distinct draft lengths as the
    predictions allow.

    A concurrency's *candidates* are the ``k >= 1`` predicted within ``close_margin`` of its
    best prediction; none when even the best is predicted above ``1 + close_margin`` (nothing to
    confirm: speculation stays off there unless a measured cell pays). A concurrency whose
    candidate cell is already ``measured`` needs nothing. The others are covered greedily: the
    draft length that is a candidate at the most uncovered concurrencies first (ties: the lower
    sum of predicted ratios, then the smaller ``k``); each concurrency then gets its
    best-predicted chosen candidate. Confirming a near-best cell instead of the best costs at
    most ``close_margin`` by the model's own account, and saves a server start per draft length.

    ``shorter`` (servers that switch the draft length in place, where a draft length costs no
    start): ties go to the shorter draft, and each concurrency gets its shortest chosen
    candidate. Within the margin the shorter draft verifies fewer tokens per step, so it loses
    less when the batch grows, and the model's longer drafts are its optimistic ones (against
    the 2026-12-05 brute-force sweep, three main jobs' predictions at concurrency 4 were 9.3 %
    too optimistic at ``k = 4`` and 6.5 % at ``k = 2``; the sweep's best there was ``k = 2``,
    1.10x, ``k = 4`` 1.04x).
    """
    by_c: dict[int, dict[int, float]] = {}
    for p in predictions:
        if p.k > 0:
            by_c.setdefault(p.concurrency, {})[p.k] = p.ratio
    candidates: dict[int, dict[int, float]] = {}
    for c, ratios in sorted(by_c.items()):
        best = min(ratios.values())
        if best >= 1.0 + close_margin:
            continue
        near = {k: r for k, r in ratios.items() if r <= best * (1.0 + close_margin)}
        if not any((c, k) in measured for k in near):
            candidates[c] = near
    chosen: set[int] = set()
    uncovered = set(candidates)
    while uncovered:
        options = {k for c in uncovered for k in candidates[c]}
        k_pick = min(
            options,
            key=lambda k: (
                -sum(k in candidates[c] for c in uncovered),
                k if shorter else 0,
                sum(candidates[c][k] for c in uncovered if k in candidates[c]),
                k,
            ),
        )
        chosen.add(k_pick)
        uncovered = {c for c in uncovered if k_pick not in candidates[c]}
    if shorter:
        return [(c, min(k for k in near if k in chosen)) for c, near in sorted(candidates.items())]
    return [
        (c, min((k for k in near if k in chosen), key=lambda k: (near[k], k)))
        for c, near in sorted(candidates.items())
    ]


def server_order(keys: Sequence[CellKey], *, last_k: int | None = None) -> list[CellKey]:
    """``keys`` grouped by draft length, so each ``k`` needs one server start.

    Every ``k`` is a server of its own (a restart: minutes for TensorRT-LLM), so cells sharing
    it are measured together: first those of ``last_k`` (the server already running), then by
    ascending ``k``; within a group by ascending concurrency. Duplicates are dropped.
    """
    unique = list(dict.fromkeys(keys))
    return sorted(unique, key=lambda key: (key[1] != last_k, key[1], key[0]))
