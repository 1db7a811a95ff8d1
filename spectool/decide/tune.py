"""Which (concurrency, k) cells to measure to choose a draft length per concurrency, and the choice.

Pure: measuring is a callback, ``measure(concurrency, k) -> CellMeasurement``; cells finished in
an earlier, interrupted run are passed in and never measured again. The search, for concurrencies
``c_1 < ... < c_n`` and a largest draft length ``K``:

1. **Baselines**: ``k = 0`` at every concurrency (the right side of the cost inequality).
2. **Acceptance**: ``k = K`` at the smallest and the largest concurrency. Per-position
   acceptance gives ``E[tokens | k]`` for every ``k <= K`` (:mod:`spectool.decide.acceptance`)
   at every concurrency, from the nearest one measured: with exact verification acceptance is a
   property of the drafter, the target and the prompts, not of the batch (where the engine
   reports only an acceptance length, a constant ``alpha`` is fitted to it instead). ``K`` at the
   largest concurrency is also the step cost where speculation is dearest (most tokens per
   verify pass): measured there, the batch-times-draft-length term of the cost model is
   interpolated, not extrapolated from ``k = 1``. The same cell shows how much smaller the decode
   batch gets with speculation (:func:`speculative_batches`).
3. **Cost model**: ``k = 1`` at the smallest concurrency, so at batch 1 the step cost is known
   at two draft lengths; :func:`~spectool.decide.model.fit_step_cost` fits it to every planned
   cell.
4. **Predict** the per-token ratio of every cell, each at its expected decode batch, and the best
   ``k`` per concurrency.
5. **Confirm**: the schedule's first value caps every other (it is ``max_draft_len``), so the
   predictions first give the best writable first value ``k1``
   (:func:`predicted_writable_first`); then, at every concurrency where some ``k <= k1`` is
   predicted to pay (or to come within ``close_margin`` of paying), one cell predicted within
   ``close_margin`` of that concurrency's best ``k <= k1`` is measured (``k1`` itself at the
   first concurrency). Every draft length is a server start (minutes for TensorRT-LLM), so the
   draft lengths are chosen to be few (:func:`confirmation_cells`: a greedy hitting set, cells
   already measured first) and their cells are measured grouped by ``k``
   (:func:`server_order`).
6. **Decide** from measurements only, every measured cell included (finished ones too): at each
   concurrency, among the cells whose bootstrap interval lies below 1 (``pays``), the one with the
   lowest measured step cost over tokens per step from acceptance pooled across the
   concurrency's cells (:func:`_ranking_ratios`); 0 when none pays. No choice may exceed the
   one at the smallest concurrency (it is the schedule's ``max_draft_len``); when the best cells
   break that rule, the predicted best writable cells are measured too and the writable set with
   the best total is chosen (:func:`_final_choices`). Because the smallest concurrency's choice
   gates all others, an ``inconclusive`` cell there may be chosen when it lets larger
   concurrencies use better paying cells and the total is better for it; a note says so.

Predictions use the planned cells (steps 1-3) only, so a resumed search predicts, and measures,
exactly what an uninterrupted one would. Without acceptance or step times (client timings and no
engine counters) nothing can be predicted, and the search falls back to measuring the full grid.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from spectool.decide.acceptance import (
    PositionCounts,
    constant_alpha_for,
    expected_tokens_per_step,
    leviathan_expected_tokens,
)
from spectool.decide.cell import CellMeasurement
from spectool.decide.cost import CellVerdict, evaluate_cell, request_terms
from spectool.decide.model import (
    CellPrediction,
    ConcurrencyGate,
    ScheduleSemantics,
    StepCostModel,
    break_even_concurrency,
    choose_k,
    fit_step_cost,
    gate_from_choices,
    observation_from_cell,
    predict_grid,
    schedule_from_choices,
)
from spectool.decide.paired import (
    PairedCell,
    bracketed_estimate,
    evaluate_paired,
    verdict_from_estimate,
)
from spectool.errors import BadInputError

MeasureFn = Callable[[int, int], "CellMeasurement | PairedCell"]
CellKey = tuple[int, int]


@dataclass(frozen=True)
class PredictionCheck:
    """A measured cell beside its prediction: how far the cost model was off."""

    concurrency: int
    k: int
    predicted_ratio: float
    measured_ratio: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class TuneResult:
    """The outcome of :func:`tune`: choices, the schedule to write, and the evidence.

    ``choices`` maps each concurrency to the chosen draft length (0 = off). ``schedule`` is the
    TensorRT-LLM ``draft_len_schedule`` encoding them under ``schedule_semantics`` (``{}`` = write
    no speculation); ``gate`` is the equivalent ``max_draft_len`` + ``max_concurrency`` pair when
    one exists. ``searched_max_draft_len`` is the ``K`` searched; ``max_draft_len`` the value the
    written config must carry (the schedule's first value, 0 when off). ``measured_now`` lists
    the cells this call measured, ``reused`` the finished cells it used; ``full_grid_runs`` is
    what measuring every cell would have cost.
    """

    engine: str
    method: str
    searched_max_draft_len: int
    concurrencies: tuple[int, ...]
    choices: dict[int, int]
    predicted_choices: dict[int, int]
    schedule: dict[int, int]
    schedule_semantics: ScheduleSemantics
    gate: ConcurrencyGate | None
    break_even_concurrency: int | None
    cells: tuple[CellVerdict, ...]
    predictions: tuple[CellPrediction, ...]
    checks: tuple[PredictionCheck, ...]
    cost_model: StepCostModel | None
    measured_now: tuple[CellKey, ...]
    reused: tuple[CellKey, ...]
    full_grid_runs: int
    notes: tuple[str, ...]

    @property
    def max_draft_len(self) -> int:
        """``max_draft_len`` for the written config: the schedule's smallest key's value, or 0."""
        return self.schedule[min(self.schedule)] if self.schedule else 0

    @property
    def runs_used(self) -> int:
        """Cells the decision rests on (measured now plus reused)."""
        return len(self.measured_now) + len(self.reused)

    def to_decision_json(self) -> dict[str, object]:
        """The ``decision.json`` object (JSON keys are strings, so concurrencies are too)."""
        return {
            "engine": self.engine,
            "method": self.method,
            "max_draft_len": self.max_draft_len,
            "searched_max_draft_len": self.searched_max_draft_len,
            "schedule": {str(c): k for c, k in sorted(self.choices.items())},
            "draft_len_schedule": {str(b): k for b, k in sorted(self.schedule.items())},
            "draft_len_schedule_semantics": self.schedule_semantics,
            "max_concurrency": None if self.gate is None else self.gate.max_concurrency,
            "break_even_concurrency": self.break_even_concurrency,
            "cells": [v.to_json() for v in self.cells],
            "runs": {"used": self.runs_used, "full_grid": self.full_grid_runs},
        }


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
) -> tuple[CellKey, ...]:
    """Cells measured before any prediction: baselines, ``K`` at ``acceptance_concurrencies``
    spread concurrencies (ends first), then ``1`` at ``cost_concurrencies`` spread ones (one: the
    smallest). Grouped by ``k``: three server starts."""
    plan: list[CellKey] = [(c, 0) for c in sorted(set(concurrencies))]
    plan += [(c, max_draft_len) for c in spread(concurrencies, acceptance_concurrencies)]
    plan += [(c, 1) for c in spread(concurrencies, cost_concurrencies)]
    return tuple(dict.fromkeys(plan))


def _base_step_ms(cell: CellMeasurement) -> float | None:
    step = cell.mean_step_ms()
    if step is not None:
        return step
    num, den = request_terms(cell.records)
    return float(num.sum() / den.sum()) if den.size else None


def _alphas_by_concurrency(
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


def tune(
    concurrencies: Sequence[int],
    max_draft_len: int,
    measure: MeasureFn,
    *,
    finished: Mapping[CellKey, CellMeasurement] | None = None,
    engine: str = "tensorrt-llm",
    method: str = "",
    n_boot: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    acceptance_concurrencies: int = 2,
    cost_concurrencies: int = 1,
    close_margin: float = 0.02,
    min_gain: float = 0.0,
    accept_inconclusive: bool = False,
    semantics: ScheduleSemantics = "up_to",
    looks: int = 1,
    finished_pairs: Mapping[CellKey, PairedCell] | None = None,
    measure_after: Callable[[int], CellMeasurement] | None = None,
) -> TuneResult:
    """Search draft lengths ``0..max_draft_len`` at ``concurrencies``; see the module docstring.

    ``finished`` holds cells measured before (a resume); they are used and never re-measured.
    ``min_gain``: a cell must beat the baseline by this fraction to be chosen.
    ``accept_inconclusive``: also choose cells whose interval straddles 1 if their ratio is
    below 1 (default: only ``pays``).

    Pairing (:mod:`spectool.decide.paired`): ``measure`` may return a
    :class:`~spectool.decide.paired.PairedCell` for a speculative cell (speculative and baseline
    blocks interleaved); its verdict then comes from the pairs (``looks``: how many times its
    interval was looked at while blocks were added). ``finished_pairs`` are such cells from an
    earlier run. ``measure_after(c)`` measures the baseline at ``c`` once more after every
    speculative cell (the *bracketed* design, for servers that restart per draft length): each
    unpaired speculative cell is then judged against the baselines before and after it.
    """
    concs = tuple(sorted(set(concurrencies)))
    if not concs or concs[0] < 1:
        raise BadInputError("tune", "need at least one concurrency, all >= 1")
    if max_draft_len < 1:
        raise BadInputError("tune", f"max_draft_len must be >= 1, got {max_draft_len}")
    grid = {(c, k) for c in concs for k in range(max_draft_len + 1)}
    cells: dict[CellKey, CellMeasurement] = {
        key: cell for key, cell in (finished or {}).items() if key in grid
    }
    for key, cell in cells.items():
        if cell.key != key:
            raise BadInputError("tune", f"finished cell stored under {key} is for {cell.key}")
    paired: dict[CellKey, PairedCell] = {
        key: cell for key, cell in (finished_pairs or {}).items() if key in grid
    }
    for key, pair_cell in paired.items():
        cells.setdefault(key, pair_cell.spec)
    reused = set(cells)
    measured_now: list[CellKey] = []
    notes: list[str] = []

    def get(c: int, k: int) -> CellMeasurement:
        if (c, k) not in cells:
            result = measure(c, k)
            if result.key != (c, k):
                raise BadInputError("tune", f"measure({c}, {k}) returned the cell {result.key}")
            if isinstance(result, PairedCell):
                paired[(c, k)] = result
                cells[(c, k)] = result.spec
            else:
                cells[(c, k)] = result
            measured_now.append((c, k))
        return cells[(c, k)]

    after: dict[int, CellMeasurement] = {}

    plan = initial_plan(
        concs,
        max_draft_len,
        acceptance_concurrencies=acceptance_concurrencies,
        cost_concurrencies=cost_concurrencies,
    )
    planned = {key: get(*key) for key in plan}

    # Predictions rest on the planned cells only, so a resumed search (which may already hold
    # confirmation cells) predicts, and therefore measures, exactly what an uninterrupted one does.
    base_step = {c: s for c in concs if (s := _base_step_ms(cells[(c, 0)])) is not None}
    batch = {c: b for c in concs if (b := cells[(c, 0)].mean_batch_size()) is not None}
    alphas = _alphas_by_concurrency(planned, concs, max_draft_len)
    observations = [
        o for cell in planned.values() if (o := observation_from_cell(cell)) is not None
    ]
    model: StepCostModel | None = None
    predictions: tuple[CellPrediction, ...] = ()
    predicted_choices: dict[int, int] = {}
    if alphas and any(o.k > 0 for o in observations) and len(base_step) == len(concs):
        model = fit_step_cost(observations)
        predictions = predict_grid(
            model,
            alphas,
            max_draft_len,
            base_step_ms=base_step,
            batch_by_concurrency=batch,
            batch_by_cell=speculative_batches(planned, concs, max_draft_len),
        )
        predicted_choices = choose_k(predictions, min_gain=min_gain)
        # Confirm the predicted best *writable* choices: none above the first concurrency's.
        k1 = predicted_writable_first(predictions, concs)
        writable = [
            p for p in predictions if 0 < p.k <= k1 and (p.concurrency != concs[0] or p.k == k1)
        ]
        wanted = confirmation_cells(writable, close_margin, measured=set(plan))
        for key in server_order(wanted, last_k=plan[-1][1]):
            get(*key)
    else:
        notes.append(
            "no acceptance counts or step times: nothing to predict from, measured the full grid"
        )
        for c in concs:
            for k in range(1, max_draft_len + 1):
                get(c, k)

    def verdict(c: int, k: int, cell: CellMeasurement) -> CellVerdict:
        if (c, k) in paired:
            return evaluate_paired(
                paired[(c, k)],
                alphas=alphas.get(c),
                confidence=confidence,
                looks=looks,
                n_boot=n_boot,
                seed=seed,
            )
        if c in after:
            estimate = bracketed_estimate(
                cell, cells[(c, 0)], after[c], confidence=confidence, n_boot=n_boot, seed=seed
            )
            return verdict_from_estimate(
                cell, cells[(c, 0)], estimate, alphas=alphas.get(c), n_boot=n_boot
            )
        return evaluate_cell(
            cell,
            cells[(c, 0)],
            alphas=alphas.get(c),
            n_boot=n_boot,
            confidence=confidence,
            seed=seed,
        )

    def decide() -> tuple[tuple[CellVerdict, ...], dict[int, int], dict[int, int]]:
        verdicts = tuple(verdict(c, k, cell) for (c, k), cell in sorted(cells.items()) if k > 0)
        ranking = _ranking_ratios(cells, verdicts)
        args = (concs, verdicts, ranking, min_gain, accept_inconclusive)
        return verdicts, _final_choices(*args), _final_choices(*args, cap=False)

    verdicts, choices, uncapped = decide()
    if predictions and uncapped != choices:
        # The best cells rise above the smallest concurrency's choice, which a schedule cannot
        # write. For each draft length measured there, confirm the predicted best cell at most
        # that long at every concurrency that wanted more, so the writable options are measured.
        first = concs[0]
        wanted = []
        for k1 in sorted(k for c, k in cells if c == first and k > 0):
            for c in concs[1:]:
                options = [p for p in predictions if p.concurrency == c and 1 <= p.k <= k1]
                best = min(options, key=lambda p: (p.ratio, p.k), default=None)
                if uncapped[c] > k1 and best is not None and best.ratio < 1.0 + close_margin:
                    wanted.append((c, best.k))
        extra = [key for key in dict.fromkeys(wanted) if key not in cells]
        last_k = measured_now[-1][1] if measured_now else None
        for key in server_order(extra, last_k=last_k):
            get(*key)
        if extra:
            verdicts, choices, uncapped = decide()
    if measure_after is not None:
        # Bracket: the baseline once more at every concurrency with an unpaired speculative cell.
        for c in sorted({c for (c, k) in cells if k > 0 and (c, k) not in paired}):
            baseline = measure_after(c)
            if baseline.key != (c, 0):
                raise BadInputError("tune", f"measure_after({c}) returned the cell {baseline.key}")
            after[c] = baseline
        if after:
            verdicts, choices, uncapped = decide()
    first_cell = next(
        (v for v in verdicts if (v.concurrency, v.k) == (concs[0], choices[concs[0]])), None
    )
    if first_cell is not None and first_cell.verdict == "inconclusive":
        enabled = [c for c in concs[1:] if choices[c] > 0]
        notes.append(
            f"k={first_cell.k} at concurrency {concs[0]} is inconclusive (ratio "
            f"{first_cell.ratio:.3f}, CI {first_cell.ci_low:.3f}-{first_cell.ci_high:.3f}); it was "
            f"kept because the schedule's first value gates every concurrency and it lets "
            f"{', '.join(map(str, enabled))} speculate where speculation pays"
        )
    if any(uncapped[c] > choices[c] for c in concs[1:]):
        notes.append(
            f"best measured draft lengths {uncapped} exceed the smallest concurrency's; a "
            f"draft_len_schedule cannot, so the best writable set was chosen: {choices}"
        )
    by_key = {(p.concurrency, p.k): p for p in predictions}
    checks = tuple(
        PredictionCheck(v.concurrency, v.k, p.ratio, v.ratio, v.ci_low, v.ci_high)
        for v in verdicts
        if (p := by_key.get((v.concurrency, v.k))) is not None
    )
    return TuneResult(
        engine=engine,
        method=method,
        searched_max_draft_len=max_draft_len,
        concurrencies=concs,
        choices=choices,
        predicted_choices=predicted_choices,
        schedule=schedule_from_choices(choices, semantics),
        schedule_semantics=semantics,
        gate=gate_from_choices(choices),
        break_even_concurrency=break_even_concurrency(choices),
        cells=verdicts,
        predictions=predictions,
        checks=checks,
        cost_model=model,
        measured_now=tuple(measured_now),
        reused=tuple(sorted(reused)),
        full_grid_runs=len(grid),
        notes=tuple(notes),
    )


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
                sum(candidates[c][k] for c in uncovered if k in candidates[c]),
                k,
            ),
        )
        chosen.add(k_pick)
        uncovered = {c for c in uncovered if k_pick not in candidates[c]}
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


def _ranking_ratios(
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


def _final_choices(
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

    The smallest concurrency's choice gates every other one, so when no cell pays there, an
    ``inconclusive`` one whose ratio is below ``1 - min_gain`` is tried as ``k1`` too, but only
    in sets where some larger concurrency then uses a cell that pays: otherwise one noisy interval at the smallest
    concurrency would switch speculation off everywhere, also where it measurably pays (on a
    CPU, where drafting overhead weighs most at batch 1, that is the usual case).
    """

    def eligible(v: CellVerdict) -> bool:
        if v.ratio >= 1.0 - min_gain:
            return False
        return v.verdict == "pays" or (accept_inconclusive and v.verdict == "inconclusive")

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
