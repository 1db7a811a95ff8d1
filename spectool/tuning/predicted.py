"""``spectool tune --predict-only``: a decision from the step-cost model, nothing measured.

It writes ``DIR/decision.json`` in the schema of a measured one (``engine``, ``method``,
``max_draft_len``, ``schedule``, ``draft_len_schedule``, ``break_even_concurrency``, ``cells``)
with ``"predicted": true`` at the top, a ``prediction`` object (acceptance input, calibration,
geometry, hardware) and every cell marked ``"source": "predicted"`` (its ratio is the predicted
step-cost ratio; its interval is the point: no measurement, no spread). Then the build folder
for it (:func:`spectool.tuning.deploy.build_for_decision`), so ``build --decision`` and ``serve
DIR`` use it; both say the decision is predicted, not measured.

Calibration: on the embedded engine the CPU probe of :mod:`spectool.predict.probe` (this
machine, a few seconds, imports torch); on TensorRT-LLM the engine defaults for ``--gpu``.
Acceptance: :func:`spectool.predicted.resolve_acceptance` (flags, a previous run's
``tune.json``, the profile's published figure). With none of those the command refuses: a
schedule needs acceptance (``check --gpu`` gives the break-even acceptance instead).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectool.errors import BadInputError
from spectool.io import atomic_write_text
from spectool.tuning.setup import DECISION_NAME

if TYPE_CHECKING:
    from spectool.predict import Prediction
    from spectool.predicted import AcceptanceFlags
    from spectool.tuning.request import ResolvedTune

LABEL = "predicted, not measured"


@dataclass(frozen=True)
class PredictedOutcome:
    decision: dict[str, Any]
    decision_path: Path
    build_files: tuple[Path, ...]
    notes: tuple[str, ...]
    lines: tuple[str, ...]  # the prediction in sentences


def calibration(resolved: ResolvedTune, geom: Any) -> tuple[Any, Any, str]:
    """(hardware, engine factors, description) for the resolved engine."""
    from spectool.predict import ENGINE_DEFAULTS, Hardware

    if resolved.engine == "torch":
        from spectool.predict.probe import probe_cpu

        cfg = resolved.report.target
        assert cfg is not None
        inter = cfg.text_config.get("intermediate_size")
        if not isinstance(inter, int) or not cfg.num_kv_heads or not cfg.vocab_size:
            raise BadInputError(cfg.path / "config.json", "no intermediate size, KV heads or vocab")
        probe = probe_cpu(
            geom.target,
            intermediate_size=inter,
            num_kv_heads=cfg.num_kv_heads,
            vocab_size=cfg.vocab_size,
            threads=resolved.threads,
        )
        return probe.hardware, probe.factors, f"CPU probe of this machine: {probe.describe()}"
    from spectool.gpu import resolve_gpu

    gpu = resolve_gpu(resolved.request.gpu)
    if gpu is None:
        raise BadInputError("--gpu", "no GPU detected: name the GPU to predict for (--gpu NAME)")
    factors = ENGINE_DEFAULTS["trtllm"]
    return Hardware.from_gpu(gpu), factors, factors.source


def resolved_setup(
    resolved: ResolvedTune,
    recipe: Any,
    *,
    context: int,
    calibrate: Callable[[ResolvedTune, Any], tuple[Any, Any, str]] | None = None,
) -> tuple[Any, Any, Any, str]:
    """``(setup, geometry, hardware, calibration)`` of the step-cost model for ``resolved``:
    geometry from headers or the recipe, calibrated by ``calibrate`` (default
    :func:`calibration`)."""
    from spectool import predicted
    from spectool.predict import setup_for

    report = resolved.report
    geom = predicted.pair_geometry(
        report.target, report.drafter, resolved.method, recipe, report.profile
    )
    hardware, factors, calibrated = (calibrate or calibration)(resolved, geom)
    setup = setup_for(
        geom.target,
        resolved.method,
        hardware,
        drafter=geom.drafter,
        mtp_layer=geom.mtp_layer,
        engine=factors,
        tp=resolved.request.tp,
        context=context,
        layout=None if resolved.request.plain_tp else resolved.request.layout(),
    )
    return setup, geom, hardware, calibrated


def predicted_cells(pred: Prediction) -> list[dict[str, Any]]:
    """decision.json cells from a prediction: ms per token with and without speculation, the
    ratio's 80 % interval (:mod:`spectool.predict.interval`: speed-up x0.76-x1.07, out of
    sample) as ``ci_low``/``ci_high``, and a verdict that is ``inconclusive`` when the interval
    straddles 1, never ``pays``."""
    from spectool.predict.interval import UNCERTAIN, interval

    spelling = {UNCERTAIN: "inconclusive"}  # decision.json's word for it
    cells = []
    for row in pred.rows:
        base_ms = row.base_step_s * 1e3
        for p in row.ks:
            if p.tokens_per_step is None:
                continue
            lhs = p.spec_step_s * 1e3 / p.tokens_per_step
            ratio = lhs / base_ms
            band = interval(1.0 / ratio)  # the speed-up's interval
            cells.append(
                {
                    "concurrency": row.concurrency,
                    "k": p.k,
                    "lhs_ms_per_token": lhs,
                    "rhs_ms_per_token": base_ms,
                    "ratio": ratio,
                    "ci_low": 1.0 / band.high,
                    "ci_high": 1.0 / band.low,
                    "verdict": spelling.get(band.verdict, band.verdict),
                    "design": "predicted",
                    "source": "predicted",
                    "tokens_per_step_predicted": p.tokens_per_step,
                    "break_even_tokens_per_step": p.break_even_length,
                }
            )
    return cells


def choices_from(pred: Prediction, min_gain: float) -> dict[int, int]:
    """Per concurrency the best k when it beats the baseline by ``min_gain``, else 0; capped
    so a larger concurrency never drafts more than a smaller one (TensorRT-LLM's schedule)."""
    from spectool.decide.model import capped_choices

    raw = {}
    for row in pred.rows:
        best = row.best
        good = best is not None and best.speedup is not None and best.speedup > 1.0 + min_gain
        raw[row.concurrency] = best.k if good and best is not None else 0
    return capped_choices(raw)


def predict_decision(
    resolved: ResolvedTune, flags: AcceptanceFlags
) -> tuple[dict[str, Any], Prediction]:
    """The decision.json object for ``resolved`` from the step-cost model (module docstring)."""
    from spectool import predicted, profiles
    from spectool.decide.model import gate_from_choices, schedule_from_choices
    from spectool.predict import describe, predict
    from spectool.predict.api import layout_json
    from spectool.tuning.plan import schedule_semantics

    report = resolved.report
    recipe = profiles.load_profile(report.profile) if report.profile else None
    acceptance = predicted.resolve_acceptance(flags, recipe, resolved.max_draft_len)
    if acceptance is None:
        raise BadInputError(
            "--predict-only",
            "a schedule needs acceptance: pass --acceptance-length, --acceptance-rate or "
            "--acceptance-from DIR (spectool check --gpu gives the break-even acceptance)",
        )
    setup, geom, hardware, calibrated = resolved_setup(
        resolved, recipe, context=predicted.DEFAULT_CONTEXT
    )
    ks = tuple(range(1, resolved.max_draft_len + 1))
    pred = predict(setup, acceptance, resolved.concurrencies, ks)
    choices = choices_from(pred, resolved.request.min_gain)
    semantics = schedule_semantics(resolved)
    schedule = schedule_from_choices(choices, semantics)
    gate = gate_from_choices(choices)
    decision: dict[str, Any] = {
        "engine": resolved.engine,
        "method": resolved.method,
        "max_draft_len": choices[min(choices)],
        "searched_max_draft_len": resolved.max_draft_len,
        "schedule": {str(c): k for c, k in sorted(choices.items())},
        "draft_len_schedule": {str(b): k for b, k in sorted(schedule.items())},
        "draft_len_schedule_semantics": semantics,
        "max_concurrency": None if gate is None else gate.max_concurrency,
        "break_even_concurrency": pred.break_even_concurrency,
        "cells": predicted_cells(pred),
        "runs": {"used": 0, "full_grid": 0},
        "predicted": True,
        "prediction": {
            "label": LABEL,
            "acceptance": acceptance.source,
            "calibration": calibrated,
            "geometry": geom.source,
            "hardware": hardware.name,
            "layout": None if setup.layout is None else layout_json(setup.layout),
            "context": predicted.DEFAULT_CONTEXT,
            "lines": describe(pred),
        },
    }
    return decision, pred


def run_predict_only(
    resolved: ResolvedTune, flags: AcceptanceFlags, *, force: bool
) -> PredictedOutcome:
    """Write ``DIR/decision.json`` and the build folder for it; refuse to replace an earlier
    decision without ``force``."""
    from spectool.tuning.deploy import build_for_decision

    out = resolved.request.out
    path = out / DECISION_NAME
    if path.exists() and not force:
        raise BadInputError(path, "exists; pass --force to replace it")
    decision, _pred = predict_decision(resolved, flags)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(decision, indent=2) + "\n")
    files, notes = build_for_decision(resolved, path, decision["max_draft_len"])
    return PredictedOutcome(decision, path, files, notes, tuple(decision["prediction"]["lines"]))
