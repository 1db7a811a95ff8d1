"""What :func:`spectool.decide.tune.tune` returns: the choices, the schedule, and the evidence."""

from __future__ import annotations

from dataclasses import dataclass

from spectool.decide.model import CellPrediction, ConcurrencyGate, ScheduleSemantics, StepCostModel
from spectool.decide.prune import PredictionError, PruneCheck, pruning_json
from spectool.decide.verdict import CellVerdict

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
    prediction_error: PredictionError | None = None  # what the prunes were checked against
    prune_checks: tuple[PruneCheck, ...] = ()  # every cell left to (or measured despite) prediction

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
            "pruning": pruning_json(self.prediction_error, self.prune_checks),
        }
