"""What a finished ``spectool tune`` run holds (:class:`TuneOutcome`): the decision, the cells,
their statistics and the files written. It imports none of the modules that read it (the
session that makes it, ``record``, ``report``, ``plots``), so their imports form no cycle."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from spectool.decide.cell import CellMeasurement
from spectool.decide.result import TuneResult
from spectool.decide.stats import CellStats
from spectool.tuning.prompts import TunePrompts
from spectool.tuning.request import ResolvedTune
from spectool.tuning.setup import TuneSetup

CellKey = tuple[int, int]


@dataclass(frozen=True)
class TuneOutcome:
    """A finished run: the decision, every cell used, and what was written where."""

    result: TuneResult
    resolved: ResolvedTune
    out: Path
    setup: TuneSetup
    prompts: TunePrompts
    cells: dict[CellKey, CellMeasurement]
    stats: dict[CellKey, CellStats]
    trials_measured_now: int
    server_starts: int
    wall_s: float
    measure_s: float
    files: tuple[Path, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    # TensorRT-LLM: design (concurrent/bracketed), GPU sets, servers and wall time saved
    servers: dict[str, object] | None = None
