"""Engine factors fitted by component to published results, and judged out of sample.

Stage 1 (:mod:`spectool.predict.baselines`): per engine, the plain decode step (achieved
bandwidth, iteration and per-layer overheads) fitted to published ABSOLUTE speeds without
speculation. Stage 2: with those fixed, the speculative parts (per speculative step, per draft
step, per sequence) fitted to the published speed-ups of ``results.csv``, which give acceptance
and k. An engine without baseline rows (the eager HF research code) fits its iteration and
per-layer overheads on its speed-ups, as before.

:func:`leave_one_source_out` refits both stages without each source in turn and predicts that
source's rows: the out-of-sample error, and the residuals the prediction intervals come from
(:mod:`spectool.predict.interval`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from spectool.predict.baselines import (
    BaselineEvaluation,
    BaselineRow,
    fit_baseline_factors,
    predict_value,
)
from spectool.predict.calibrate import fit_factors
from spectool.predict.cost import EngineFactors
from spectool.predict.published import Evaluation, PublishedRow, predict_row, usable

# What an engine's factors are before any fitting (a GPU engine with CUDA graphs: 0.5 ms per
# iteration, 0.3 ms per speculative step, 2 us per layer, nothing per draft step or sequence),
# used where a held-out source leaves its engine no rows.
PRIOR = EngineFactors(
    bw_fraction=0.75,
    flops_fraction=0.6,
    step_overhead_s=0.5e-3,
    forward_overhead_s=20e-6,
    layer_overhead_s=2e-6,
    spec_overhead_s=0.3e-3,
    source="a priori GPU engine (before fitting)",
)
# Stage 2 for an engine with baseline rows: the speculative parts only.
SPEC_FITTED = ("spec_overhead_s", "draft_step_overhead_s")
# An engine without baseline rows fits its plain-step overheads on its speed-ups too.
FITTED = ("step_overhead_s", "spec_overhead_s", "layer_overhead_s")
# The per-sequence speculative cost (a slope in concurrency) is set from the engine's structure,
# not fitted: the table's only rows over concurrency (SpecForge's closed-set runs) averaged
# decode batches of 1 to 8.4, too narrow to tell a slope from noise. SGLang runs its overlap
# scheduler (the host's per-request work of step i hidden behind the GPU's step i+1) for plain
# decode but turns it off for EAGLE/EAGLE-3 ("Overlap scheduler is disabled because of using
# eagle3 or standalone speculative decoding" unless SGLANG_ENABLE_SPEC_V2;
# sgl-project/sglang python/sglang/srt/server_args.py, v0.5.6), so a speculative step pays the
# per-request host work in series: 50 us per sequence (the figure the previous whole-table fit
# found). Checked out of sample on the EAGLE-3 paper's SGLang series over batch 2-64.
SEQ_TERM = "spec_seq_overhead_s"
SEQ_PRIOR: dict[str, float] = {"sglang": 50e-6}
GRIDS: dict[str, tuple[float, ...]] = {
    "draft_step_overhead_s": (0.0, 0.1e-3, 0.2e-3, 0.3e-3, 0.5e-3, 0.7e-3, 1e-3),
}


def fit_engine_defaults(
    rows: list[PublishedRow],
    models: Mapping[str, Mapping[str, Any]],
    baselines: Sequence[BaselineRow] = (),
) -> dict[str, EngineFactors]:
    """Per engine of the usable speed-up rows: stage 1 on its baseline rows (if any), then
    stage 2 at the grid point minimising the mean |log(pred / published)| of its speed-ups
    (:data:`SEQ_PRIOR` fixed). An engine with no more speed-up rows than factors to fit keeps
    the :data:`PRIOR`'s speculative parts, as stage 1 keeps its prior below four baseline rows:
    two factors fitted to one row reproduce it and nothing else.

    The mean, not the median: with several factors and 8-20 rows per engine, the median is
    minimised by any grid point that fits half the rows and ignores the rest. The absolute (not
    squared) error keeps one noisy row from pulling the fit."""
    spec_rows = usable(rows)
    engines = sorted({r.engine for r in spec_rows})
    with_base = [b for b in baselines if b.engine in engines]
    stage1 = fit_baseline_factors(with_base, models, {e: PRIOR for e in engines})
    fitted: dict[str, EngineFactors] = {}
    for engine in engines:
        sub = [r for r in spec_rows if r.engine == engine]
        names = SPEC_FITTED if engine in stage1 else FITTED

        def loss(f: EngineFactors, sub: list[PublishedRow] = sub, engine: str = engine) -> float:
            return statistics.fmean(
                abs(math.log(predict_row(r, models, {engine: f}) / r.speedup)) for r in sub
            )

        base = stage1.get(engine, PRIOR).but(spec_seq_overhead_s=SEQ_PRIOR.get(engine, 0.0))
        if len(sub) <= len(names):  # as many factors as rows: memorised, not fitted
            fitted[engine] = base
            continue
        fitted[engine] = fit_factors(base, names, loss, len(sub), GRIDS).factors
    return fitted


def leave_one_source_out(
    rows: list[PublishedRow],
    models: Mapping[str, Mapping[str, Any]],
    baselines: Sequence[BaselineRow] = (),
) -> Evaluation:
    """Each source's speed-ups predicted with factors fitted without that source (neither its
    speed-ups nor its baselines); the unfitted :data:`PRIOR` where its engine has no other
    source: is the fit more than memorised rows?"""
    predicted: list[tuple[PublishedRow, float]] = []
    for source in sorted({r.source_id for r in usable(rows)}):
        held = [r for r in usable(rows) if r.source_id == source]
        engines = {r.engine for r in held}  # other engines' fits do not touch these rows
        rest = [r for r in rows if r.source_id != source and r.engine in engines]
        rest_base = [b for b in baselines if b.source_id != source and b.engine in engines]
        fitted = fit_engine_defaults(rest, models, rest_base)
        factors = {r.engine: fitted.get(r.engine, PRIOR) for r in held}
        predicted += [(r, predict_row(r, models, factors)) for r in held]
    return Evaluation(tuple(predicted))


def leave_one_source_out_baselines(
    baselines: Sequence[BaselineRow], models: Mapping[str, Mapping[str, Any]]
) -> BaselineEvaluation:
    """Each source's baseline rows predicted with stage 1 fitted on the other sources' rows of
    the same engine (:data:`PRIOR` where there are none)."""
    predicted: list[tuple[BaselineRow, float]] = []
    for source in sorted({b.source_id for b in baselines}):
        held = [b for b in baselines if b.source_id == source]
        engines = {b.engine for b in held}
        rest = [b for b in baselines if b.source_id != source and b.engine in engines]
        fitted = fit_baseline_factors(rest, models, {e: PRIOR for e in engines})
        factors = {b.engine: fitted.get(b.engine, PRIOR) for b in held}
        predicted += [(b, predict_value(b, models, factors)) for b in held]
    return BaselineEvaluation(tuple(predicted))
