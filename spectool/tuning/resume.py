"""What a resumed run reuses from ``trials.jsonl``: finished cells and paired cells, failed
trials dropped (measured again), and the check that every request of a trial succeeded."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from spectool.decide.cell import CellMeasurement
from spectool.decide.paired import PairedCell
from spectool.decide.verdict import Design
from spectool.errors import ChildProcessError_
from spectool.io import atomic_write_text
from spectool.measure.runner import TrialResult
from spectool.tuning.outcome import CellKey
from spectool.tuning.pairing import NotSaved, measure_paired
from spectool.tuning.request import ResolvedTune
from spectool.tuning.trials import CellPlan, pooled_cell


def check_requests(results: Sequence[TrialResult], where: str) -> None:
    for trial in results:
        failed = trial.errors
        if failed:
            raise ChildProcessError_(
                f"{where}: {len(failed)} of {len(trial.records)} requests failed in trial "
                f"{trial.config.label!r} (first: {failed[0].error}); a cell is measured on "
                "complete requests only. Fix the server (see its log), then rerun with --resume "
                "(failed trials are measured again)"
            )


def drop_failed_trials(path: Path, saved: Mapping[str, TrialResult]) -> int:
    """Rewrite ``path`` without the trials that had a failed request; returns how many.

    A failed trial is never used (:func:`check_requests`); dropping it lets ``--resume``
    measure it again instead of refusing the whole folder.
    """
    failed = {key for key, trial in saved.items() if trial.errors}
    if not failed:
        return 0
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        try:
            key = json.loads(line).get("key")
        except (json.JSONDecodeError, AttributeError):
            key = None
        if key not in failed:
            kept.append(line)
    atomic_write_text(path, "".join(kept))
    return len(failed)


def finished_cells(
    saved: Mapping[str, TrialResult], plan: CellPlan, grid: Sequence[CellKey]
) -> dict[CellKey, CellMeasurement]:
    """Cells of ``grid`` whose every repeat is in ``saved`` (a resumed run reuses them)."""
    cells: dict[CellKey, CellMeasurement] = {}
    for c, k in grid:
        keys = [config.key() for config in plan.configs(c, k)]
        if all(key in saved for key in keys):
            results = [saved[key] for key in keys]
            check_requests(results, f"saved cell (concurrency={c}, k={k})")
            cells[(c, k)] = pooled_cell(results, k)
    return cells


def paired_options(resolved: ResolvedTune) -> dict[str, object]:
    """The stopping rule's settings (the same for a resumed run)."""
    req = resolved.request
    return {
        "threshold": 1.0 - req.min_gain,
        "confidence": req.confidence,
        "seed": req.seed,
        "budget_s": req.budget_s,
        "objective": req.objective,
    }


def finished_pairs(
    saved: Mapping[str, TrialResult],
    plan: CellPlan,
    grid: Sequence[CellKey],
    options: Mapping[str, object],
    stops: Mapping[CellKey, int] | None = None,
    design: Design = "interleaved",
) -> dict[CellKey, PairedCell]:
    """Paired cells of ``grid`` whose every block is in ``saved`` (up to where they stopped;
    ``stops``: cells a joint cell ended early, and their pairs; ``design``: how they were
    measured)."""
    out: dict[CellKey, PairedCell] = {}
    for c, k in grid:
        if k == 0:
            continue

        def lookup(pair: int, arm: int, c: int = c, k: int = k) -> TrialResult:
            trial = saved.get(plan.block_config(c, k, pair, arm).key())
            if trial is None:
                raise NotSaved
            check_requests([trial], f"saved block (concurrency={c}, k={k})")
            return trial

        try:
            out[(c, k)] = measure_paired(
                c,
                k,
                lookup,
                **plan.pass_options(c),  # type: ignore[arg-type]
                **options,  # type: ignore[arg-type]
                stop_after=(stops or {}).get((c, k)),
                design=design,
            )
        except NotSaved:
            continue
    return out
