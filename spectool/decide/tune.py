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
   ``k`` per concurrency. The baseline a ratio is taken against is, where the plan measured a
   paired cell, that cell's own baseline blocks (the minutes whose speculative steps the model
   fits), elsewhere the planning baseline scaled to them (:func:`~spectool.decide.search.
   prediction_baselines`); for the users' time per token (``tpot``, its tails) each baseline's
   prefill stall per token is on both sides of the ratio (:mod:`spectool.decide.model`, *Stall*).
5. **Confirm**: the schedule's first value caps every other (it is ``max_draft_len``), so the
   predictions first give the best writable first value ``k1``
   (:func:`predicted_writable_first`); then, at every concurrency where some ``k <= k1`` is
   predicted to pay (or to come within ``close_margin`` of paying), one cell predicted within
   ``close_margin`` of that concurrency's best ``k <= k1`` is measured (``k1`` itself at the
   first concurrency). Every draft length is a server start (minutes for TensorRT-LLM), so the
   draft lengths are chosen to be few (:func:`confirmation_cells`: a greedy hitting set, cells
   already measured first) and their cells are measured grouped by ``k``
   (:func:`server_order`).
5b. **Neighbours** (servers that switch the draft length in place, where a cell costs blocks,
   not a server start): at each concurrency the unmeasured ``k`` whose prediction, scaled by
   its nearest measured neighbour's, could beat the choice by more than the tie margin within
   the predictor's error against a neighbour is measured, the best one per concurrency
   (:func:`~spectool.decide.prune.worth_measuring`; issue 21 point 4: a draft length within
   the predictor's error is measured, not pruned). Judged on the cells of steps 1-5 only.
5c. **The first row** (the same servers): at the smallest concurrency every draft length is
   measured: its cells are the cheapest, its choice caps the others, and there the linear form
   misjudges a neighbour most (rows computed in blocks: README, "Every draft length at the
   smallest concurrency"). A method out of contention stops as in step 5.
6. **Decide** from measurements only, every measured cell included (finished ones too): at each
   concurrency, among the cells whose bootstrap interval lies below 1 (``pays``), the one with the
   lowest measured step cost over tokens per step from acceptance pooled across the
   concurrency's cells (:func:`~spectool.decide.choose.ranking_ratios`); 0 when none pays. No
   choice may exceed the one at the smallest concurrency (it is the schedule's
   ``max_draft_len``); when the best cells break that rule, the predicted best writable cells
   are measured too and the writable set with the best total is chosen
   (:func:`~spectool.decide.choose.final_choices`). Because the smallest concurrency's choice
   gates all others, an ``inconclusive`` cell there may be chosen when it lets larger
   concurrencies use better paying cells and the total is better for it; a note says so.

Predictions use the planned cells (steps 1-3) only, so a resumed search predicts, and measures,
exactly what an uninterrupted one would. Without acceptance or step times (client timings and no
engine counters) nothing can be predicted, and the search falls back to measuring the full grid.

The plan of steps 1-5 lives in :mod:`spectool.decide.search`, the choice of step 6 in
:mod:`spectool.decide.choose`, the returned :class:`~spectool.decide.result.TuneResult` in
:mod:`spectool.decide.result`; this module runs them in order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from spectool.decide.cell import CellMeasurement, pooled
from spectool.decide.choose import final_choices, ranking_ratios
from spectool.decide.cost import evaluate_cell
from spectool.decide.methods import TIE_MARGIN, Rival
from spectool.decide.model import (
    CellPrediction,
    ScheduleSemantics,
    StepCostModel,
    StepCostObservation,
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
from spectool.decide.prune import (
    PredictionError,
    PruneCheck,
    against_best_method,
    against_rival,
    left_to_prediction,
    neighbour_bound,
    prediction_error,
    ranking_error,
    worth_measuring,
)
from spectool.decide.result import CellKey, PredictionCheck, TuneResult
from spectool.decide.search import (
    alphas_by_concurrency,
    confirmation_cells,
    initial_plan,
    predicted_writable_first,
    prediction_baselines,
    server_order,
    speculative_batches,
)
from spectool.decide.verdict import CellVerdict, objective_source
from spectool.errors import BadInputError

MeasureFn = Callable[[int, int], "CellMeasurement | PairedCell"]

__all__ = ["MeasureFn", "TuneResult", "tune"]


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
    rival: Mapping[int, float] | None = None,
    prior_step: Callable[[float, int], float] | None = None,
    error: PredictionError | None = None,
    objective: str = "steps",
    switches_in_place: bool = False,
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

    ``rival`` (when several methods are compared, :mod:`spectool.decide.methods`): per
    concurrency, the per-token ratio another method already measured there (1.0 = it stays
    off). Cells that cannot beat the rival even at the optimistic end of their prediction
    interval are not confirmed (:func:`spectool.decide.prune.against_rival`; ``error``: the
    predictor's measured error, by default :func:`~spectool.decide.prune.prediction_error` for
    ``objective``); every prune is recorded with its margin (``TuneResult.prune_checks``).

    ``prior_step(batch, k)``: a step time from first principles (:mod:`spectool.predict`, any
    unit), for servers that restart per draft length. The plan then measures no ``k = 1`` cost
    cell (a server start fewer unless ``k = 1`` is confirmed later): that cell's step cost is the measured ``k = K`` step at the
    smallest concurrency times the prior's ``k=1 / k=K`` ratio, and a note says so.

    ``switches_in_place``: the server changes draft length without a restart (the embedded
    engine), so among the cells predicted within ``close_margin`` of a concurrency's best the
    shorter draft is confirmed (:func:`~spectool.decide.search.confirmation_cells`), step 5b
    measures the draft lengths its neighbours say could still win, and step 5c every draft
    length at the smallest concurrency.
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
    error = error if error is not None else prediction_error(objective)
    prune_checks: list[PruneCheck] = []

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
        prior=prior_step is not None,
    )
    planned = {key: get(*key) for key in plan}

    # Predictions rest on the planned cells only, so a resumed search (which may already hold
    # confirmation cells) predicts, and therefore measures, exactly what an uninterrupted one does.
    # Baselines: the planned paired cells' own baseline blocks where the plan has them, and
    # each baseline's prefill stall when the objective is the users' time per token
    paired_base = {
        c: pooled([paired[key].base for key in plan if key[0] == c and key in paired])
        for c in {c for c, k in plan if k > 0 and (c, k) in paired}
    }
    baselines = prediction_baselines(
        {c: cells[(c, 0)] for c in concs},
        paired_base,
        stalls=objective_source(objective) == "requests",
    )
    base_step, batch = baselines.step_ms, baselines.batch
    alphas = alphas_by_concurrency(planned, concs, max_draft_len)
    observations = [
        o
        for key, cell in planned.items()
        if key[1] > 0 and (o := observation_from_cell(cell)) is not None
    ]
    observations += baselines.observations
    if prior_step is not None and max_draft_len > 1:
        observations += _prior_observations(observations, prior_step, max_draft_len, notes)

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
                cell,
                cells[(c, 0)],
                after[c],
                confidence=confidence,
                n_boot=n_boot,
                seed=seed,
                objective=objective,
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
            source=objective_source(objective),
        )

    def decide(
        only: set[CellKey] | None = None,
    ) -> tuple[tuple[CellVerdict, ...], dict[int, int], dict[int, int]]:
        """The verdicts and the choices (capped, uncapped), from every measured cell or from
        those of ``only``."""
        use = {key: cell for key, cell in cells.items() if only is None or key in only}
        verdicts = tuple(verdict(c, k, cell) for (c, k), cell in sorted(use.items()) if k > 0)
        ranking = ranking_ratios(use, verdicts)
        args = (concs, verdicts, ranking, min_gain, accept_inconclusive)
        return verdicts, final_choices(*args), final_choices(*args, cap=False)

    def in_contention(wanted: Sequence[CellKey]) -> bool:
        """Whether this method can still be deployed before its next confirmation cell: the
        cells of ``wanted`` not measured yet against the best earlier method's score, with
        every cell measured so far (:func:`~spectool.decide.prune.against_best_method`). A cell
        at a concurrency where this method measured a draft length is judged by its prediction
        scaled by that neighbour's interval's low end, with the ranking error
        (:func:`~spectool.decide.prune.neighbour_bound`), the others by their own prediction
        and ``error``. Checked before each cell, so a resumed search, and the joint design's
        repeated dry searches, stop where an uninterrupted one does."""
        if not isinstance(rival, Rival):
            return True
        keys = [key for key in wanted if key not in cells]
        if not keys:
            return True
        verdicts_now, held, _ = decide()
        ratio_of = {(v.concurrency, v.k): v.ratio for v in verdicts_now}
        holds = {c: ratio_of[(c, k)] if k > 0 else 1.0 for c, k in held.items()}
        near = neighbour_bound(predictions, verdicts_now)
        pending = {key: near.get(key, by_prediction[key]) for key in keys}
        errors = {key: ranking_error(key[0]) for key in keys if key in near}
        pruned, checks, pruned_notes = against_best_method(
            method, holds, pending, rival.method, rival.score, error, TIE_MARGIN, errors
        )
        if pruned:
            prune_checks.extend(checks)
            notes.extend(pruned_notes)
        return not pruned

    by_prediction: dict[CellKey, float] = {}
    model: StepCostModel | None = None
    predictions: tuple[CellPrediction, ...] = ()
    predicted_choices: dict[int, int] = {}
    more: list[CellKey] = []  # step 5b's cells
    if alphas and any(o.k > 0 for o in observations) and len(base_step) == len(concs):
        model = fit_step_cost(observations)
        predictions = predict_grid(
            model,
            alphas,
            max_draft_len,
            base_step_ms=base_step,
            batch_by_concurrency=batch,
            batch_by_cell=speculative_batches(planned, concs, max_draft_len),
            stall_ms=baselines.stall_ms,
        )
        by_prediction = {(p.concurrency, p.k): p.ratio for p in predictions}
        predicted_choices = choose_k(predictions, min_gain=min_gain)
        # Confirm the predicted best *writable* choices: none above the first concurrency's.
        k1 = predicted_writable_first(predictions, concs)
        writable = [
            p for p in predictions if 0 < p.k <= k1 and (p.concurrency != concs[0] or p.k == k1)
        ]
        if rival:
            writable, checks, pruned = against_rival(writable, rival, error, close_margin)
            prune_checks += checks
            notes += pruned
        wanted = confirmation_cells(
            writable, close_margin, measured=set(plan), shorter=switches_in_place
        )
        contending = True
        for key in server_order(wanted, last_k=plan[-1][1]):
            if not (contending := in_contention(wanted)):
                break
            get(*key)
        # Step 5b (servers that switch in place: on the others a draft length measured again
        # would be a server start): a draft length the confirmed cells' neighbours say could
        # beat the choice by more than the tie margin is measured. Judged on the plan's and the
        # confirmations' cells only, so a resumed search (holding these cells too) wants the
        # same ones.
        if switches_in_place and contending:
            stage = {key for key in (*plan, *wanted) if key in cells}
            stage_verdicts, stage_choices, _ = decide(stage)
            more, checks = worth_measuring(
                predictions,
                stage_verdicts,
                stage_choices,
                tie_margin=TIE_MARGIN,
                close_margin=close_margin,
                shorter=True,
            )
            by_prediction.update({(x.concurrency, x.k): x.predicted_ratio for x in checks})
            # Step 5c: the smallest concurrency's other draft lengths (module docstring)
            first_row = [(concs[0], k) for k in range(1, max_draft_len + 1)]
            more += [key for key in first_row if key not in {*plan, *wanted, *more}]
            last_k = measured_now[-1][1] if measured_now else None
            for key in server_order(more, last_k=last_k):
                if not in_contention(more):
                    break
                get(*key)
            prune_checks += [x for x in checks if (x.concurrency, x.k) in cells]
    else:
        notes.append(
            "no acceptance counts or step times: nothing to predict from, measured the full grid"
        )
        for c in concs:
            for k in range(1, max_draft_len + 1):
                get(c, k)

    verdicts, choices, uncapped = decide()
    if predictions and uncapped != choices:
        # The best cells rise above the smallest concurrency's choice, which a schedule cannot
        # write. For each draft length measured there, confirm the predicted best cell at most
        # that long at every concurrency that wanted more, so the writable options are measured.
        first = concs[0]
        wanted = []
        # A draft length measured at the first concurrency for its neighbours' or the row's
        # sake (steps 5b, 5c) is a first value to try only when it is the choice there now or
        # the best cell there.
        firsts = {k for c, k in cells if c == first and k > 0}
        firsts -= {k for c, k in more if c == first and k not in (choices[first], uncapped[first])}
        for k1 in sorted(firsts):
            for c in concs[1:]:
                options = [p for p in predictions if p.concurrency == c and 1 <= p.k <= k1]
                best = min(options, key=lambda p: (p.ratio, p.k), default=None)
                bar = min(1.0, (rival or {}).get(c, 1.0))
                if uncapped[c] > k1 and best is not None and best.ratio < bar + close_margin:
                    wanted.append((c, best.k))
        extra = [key for key in dict.fromkeys(wanted) if key not in cells]
        last_k = measured_now[-1][1] if measured_now else None
        for key in server_order(extra, last_k=last_k):
            if not in_contention(extra):
                break
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
    left, left_notes = left_to_prediction(predictions, verdicts, choices, error)
    prune_checks += left
    notes += left_notes
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
        prediction_error=error if predictions else None,
        prune_checks=tuple(prune_checks),
    )


def _prior_observations(
    observations: Sequence[StepCostObservation],
    prior_step: Callable[[float, int], float],
    max_draft_len: int,
    notes: list[str],
) -> list[StepCostObservation]:
    """The ``k = 1`` step cost the plan left to the prior (see :func:`tune`): the smallest-batch
    ``k = K`` observation scaled by the prior's ``k=1 / k=K`` ratio, with a note; none without
    such an observation."""
    added: list[StepCostObservation] = []
    anchors = [o for o in observations if o.k == max_draft_len]
    if not anchors:
        return added
    anchor = min(anchors, key=lambda o: o.batch)
    if not any(o.k == 1 for o in observations):
        scale = prior_step(anchor.batch, 1) / prior_step(anchor.batch, max_draft_len)
        added.append(StepCostObservation(anchor.batch, 1, anchor.step_ms * scale))
        notes.append(
            f"k=1 not measured at planning (the prior stands in for it): its step cost at batch "
            f"{anchor.batch:.1f} is the measured k={max_draft_len} step ({anchor.step_ms:.2f} ms) "
            f"times the roofline prior's k=1/k={max_draft_len} ratio ({scale:.3f})"
        )
    return added
