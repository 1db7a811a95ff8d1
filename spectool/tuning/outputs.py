"""A tune run's outputs, once measured and decided: ``decision.json`` and the build files,
``tune.json``, ``report.md`` and the figures, with the notes they share."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Protocol

from spectool.decide.cell import CellMeasurement
from spectool.decide.result import TuneResult
from spectool.decide.stats import CellStats, stall_notes
from spectool.errors import SpectoolError
from spectool.tuning.outcome import CellKey, TuneOutcome
from spectool.tuning.pairing import drift_notes
from spectool.tuning.prompts import TunePrompts
from spectool.tuning.request import ResolvedTune
from spectool.tuning.setup import TuneSetup


class MessageSink(Protocol):
    def on_message(self, text: str) -> None:
        """A line worth showing."""


def step_ratios(
    cells: dict[CellKey, CellMeasurement], choices: dict[int, int]
) -> dict[CellKey, float]:
    """Per chosen cell, its decode steps' cost per token over the baseline's (the cost
    inequality's ratio, from the engine's iterations), where both cells have iterations."""
    from spectool.decide.cost import iteration_terms

    out: dict[CellKey, float] = {}
    for c, k in choices.items():
        spec, base = cells.get((c, k)), cells.get((c, 0))
        if k == 0 or spec is None or base is None or not spec.iterations or not base.iterations:
            continue
        s_num, s_den = iteration_terms(spec.iterations)
        b_num, b_den = iteration_terms(base.iterations)
        out[(c, k)] = float((s_num.sum() / s_den.sum()) / (b_num.sum() / b_den.sum()))
    return out


def write_outputs(
    resolved: ResolvedTune,
    result: TuneResult,
    *,
    out: Path,
    setup: TuneSetup,
    prompts: TunePrompts,
    cells: dict[CellKey, CellMeasurement],
    stats: dict[CellKey, CellStats],
    trials_measured_now: int,
    server_starts: int,
    started: float,
    servers: dict[str, object] | None = None,
    measure_s: float,
    progress: MessageSink | None,
) -> TuneOutcome:
    """decision.json and the build files, then tune.json, report.md and the figures.
    ``servers``: TensorRT-LLM's design, GPU sets and server wall time (decision.json's
    ``measurement``, :func:`spectool.tuning.session._servers_ledger`).

    A build that fails (e.g. a release that cannot express the schedule) still leaves the
    measurements, tune.json and report.md written; its error is raised last.
    """
    from spectool.tuning import plots, record, report
    from spectool.tuning.deploy import write_decision, write_deployment

    files: list[Path] = []
    notes: list[str] = list(result.notes)
    if prompts.dropped:
        notes.append(
            f"{prompts.dropped} prompts were left out: with their output they would not fit the "
            f"server's sequence limit (at most {prompts.max_prompt_tokens} prompt tokens with "
            "--max-tokens output tokens)"
        )
    if prompts.skipped:
        notes.append(
            f"{prompts.skipped} conversations of the workload have no question or no answer "
            "and were left out (as vLLM's ShareGPT loader does)"
        )
    notes += stall_notes(result.choices, result.cells, stats, step_ratios(cells, result.choices))
    notes += drift_notes(result.cells, result.choices)
    build_error: SpectoolError | None = None
    try:
        extra = {"measurement": servers} if servers is not None else None
        deployment = write_deployment(resolved, result, out, extra=extra)
        files += [deployment.decision_path, *deployment.build_files]
        notes += [f"build: {n}" for n in deployment.notes]
    except SpectoolError as exc:
        build_error = exc
        files.append(write_decision(result, out, extra=extra))
        notes.append(f"build files not written: {exc}")
    outcome = TuneOutcome(
        result=result,
        resolved=resolved,
        out=out,
        setup=setup,
        prompts=prompts,
        cells=cells,
        stats=stats,
        trials_measured_now=trials_measured_now,
        server_starts=server_starts,
        servers=servers,
        wall_s=0.0,
        measure_s=measure_s,
        files=(),
        notes=tuple(notes),
    )
    try:
        files += plots.write_plots(outcome)
    except ImportError as exc:  # matplotlib is an optional extra
        notes.append(
            f"figures not drawn: {exc.name or 'matplotlib'} is not installed (pip install 'spectool[plots]')"
        )
        outcome = _replace(outcome, notes=tuple(notes))
    files = list(dict.fromkeys(files))
    outcome = _replace(outcome, wall_s=time.perf_counter() - started, files=tuple(files))
    files.append(record.write_tune_json(outcome))
    files.append(report.write_report(outcome))
    files = list(dict.fromkeys(files))  # decision.json is also one of the build's files
    outcome = _replace(outcome, wall_s=time.perf_counter() - started, files=tuple(files))
    if progress is not None:
        for path in files:
            progress.on_message(f"wrote {path}")
    if build_error is not None:
        raise build_error
    return outcome


def _replace(outcome: TuneOutcome, **changes: object) -> TuneOutcome:
    return dataclasses.replace(outcome, **changes)  # type: ignore[arg-type]
