"""A tune decision (``decision.json``) as ``build`` and ``serve`` read it.

``spectool tune`` writes ``decision.json`` (:meth:`spectool.decide.tune.TuneResult.
to_decision_json`): the draft length chosen per measured concurrency (``schedule``, 0 = off), the
break-even concurrency and every measured cell of the cost inequality. ``build`` turns the choices
into the engine's runtime gate (``draft_len_schedule`` or ``max_concurrency``); ``serve``'s cost
gate reads them, with the cells, to say whether speculation pays at the expected load.

Choices between measured concurrencies follow :func:`spectool.decide.model.choice_for_batch`: a
batch size takes the choice of the next measured concurrency at or above it, and beyond the
largest measured concurrency speculation is off (nothing was measured there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from spectool.constants import MAX_JSON_BYTES
from spectool.decide.model import (
    ConcurrencyGate,
    ScheduleSemantics,
    capped_choices,
    choice_for_batch,
    gate_from_choices,
    schedule_from_choices,
)
from spectool.errors import BadInputError

# decision.json carries more keys than build and serve read (searched_max_draft_len, the
# per-release draft_len_schedule, runs, ...), so unknown keys are ignored, not refused.
_IGNORE_EXTRA = ConfigDict(extra="ignore", frozen=True)


class DecisionCell(BaseModel):
    """One measured (concurrency, k) cell: both sides of the cost inequality in ms per token."""

    model_config = _IGNORE_EXTRA

    concurrency: int = Field(ge=1)
    k: int = Field(ge=0)
    lhs_ms_per_token: float
    rhs_ms_per_token: float
    ratio: float
    ci_low: float
    ci_high: float
    verdict: Literal["pays", "does_not_pay", "inconclusive"]
    # "predicted": from the step-cost model (tune --predict-only); its interval is the model's
    # leave-one-source-out band (spectool.predict.interval), not a measurement's
    source: Literal["measured", "predicted"] = "measured"

    def describe(self) -> str:
        """One phrase with the measured numbers, e.g. for the cost gate's explanation."""
        if self.source == "predicted":
            return (
                f"k={self.k} at concurrency {self.concurrency}: {self.lhs_ms_per_token:.2f} "
                f"ms/token vs {self.rhs_ms_per_token:.2f} without speculation (ratio "
                f"{self.ratio:.3f}, predicted, not measured)"
            )
        return (
            f"k={self.k} at concurrency {self.concurrency}: {self.lhs_ms_per_token:.2f} ms/token "
            f"vs {self.rhs_ms_per_token:.2f} without speculation (ratio {self.ratio:.3f}, CI "
            f"{self.ci_low:.3f}-{self.ci_high:.3f}, {self.verdict.replace('_', ' ')})"
        )


class DecisionRate(BaseModel):
    """The deployment against the baseline at one arrival rate (:mod:`spectool.tuning.rates`):
    the objective's paired ratio (deployed / baseline, below 1 pays) and the mean requests in
    flight per arm (Little's law), the concurrency the server saw at that rate."""

    model_config = _IGNORE_EXTRA

    rate_per_s: float = Field(gt=0)
    burstiness: float = Field(default=1.0, gt=0)
    trace: bool = False
    objective_ratio: float = Field(gt=0)
    ci_low: float
    ci_high: float
    verdict: Literal["pays", "does_not_pay", "inconclusive"]
    in_flight_base: float = Field(ge=0)
    in_flight_spec: float = Field(ge=0)

    def describe(self, objective: str) -> str:
        kind = "trace replay at" if self.trace else "arrivals at"
        return (
            f"{kind} {self.rate_per_s:.3g} req/s: deployed / baseline {objective} "
            f"{self.objective_ratio:.3f} (CI {self.ci_low:.3f}-{self.ci_high:.3f}, "
            f"{self.verdict.replace('_', ' ')}; {self.in_flight_base:.1f} requests in flight "
            "without speculation)"
        )


class Decision(BaseModel):
    """The parts of ``decision.json`` spectool acts on (see the module docstring)."""

    model_config = _IGNORE_EXTRA

    engine: str
    method: str
    max_draft_len: int = Field(ge=0)
    schedule: dict[int, int]
    break_even_concurrency: int | None = None
    cells: tuple[DecisionCell, ...] = ()
    # tune --predict-only: the choices come from the step-cost model; ``prediction`` says from
    # which acceptance input and calibration (spectool.tuning.predicted)
    predicted: bool = False
    prediction: dict[str, Any] | None = None
    # tune --request-rate: the deployment at the users' arrival rates, and the objective
    rates: tuple[DecisionRate, ...] = ()
    rates_objective: str | None = None

    @property
    def label(self) -> str:
        """ "measured" or "predicted, not measured": every output that shows the decision says it."""
        return "predicted, not measured" if self.predicted else "measured"

    @model_validator(mode="after")
    def _consistent(self) -> Decision:
        if not self.schedule:
            raise ValueError("schedule is empty: no concurrency was decided")
        if self.predicted != any(c.source == "predicted" for c in self.cells) and self.cells:
            raise ValueError("predicted must be true exactly when the cells are predicted")
        if any(c < 1 for c in self.schedule) or any(k < 0 for k in self.schedule.values()):
            raise ValueError("schedule needs concurrencies >= 1 and draft lengths >= 0")
        if capped_choices(self.schedule) != dict(sorted(self.schedule.items())):
            raise ValueError(
                "schedule has a larger draft length at a larger concurrency than at the smallest "
                "one; TensorRT-LLM cannot express that"
            )
        first = self.schedule[min(self.schedule)]
        if first != self.max_draft_len:
            raise ValueError(
                f"max_draft_len {self.max_draft_len} differs from the choice at the smallest "
                f"concurrency ({first})"
            )
        return self

    @property
    def concurrencies(self) -> tuple[int, ...]:
        return tuple(sorted(self.schedule))

    @property
    def speculates_anywhere(self) -> bool:
        return any(k > 0 for k in self.schedule.values())

    @property
    def off_above(self) -> int | None:
        """Largest measured concurrency that still speculates (None: none does)."""
        on = [c for c, k in self.schedule.items() if k > 0]
        return max(on) if on else None

    def choice_at(self, concurrency: int) -> int:
        """Draft length for ``concurrency`` (bucket rule; 0 beyond the largest measured)."""
        return choice_for_batch(self.schedule, concurrency)

    def bucket(self, concurrency: int) -> int | None:
        """The measured concurrency whose choice covers ``concurrency`` (None: beyond them)."""
        above = [c for c in self.concurrencies if c >= concurrency]
        return above[0] if above else None

    def cell(self, concurrency: int, k: int) -> DecisionCell | None:
        return next((c for c in self.cells if c.concurrency == concurrency and c.k == k), None)

    def best_cell(self, concurrency: int) -> DecisionCell | None:
        """The speculative cell (k > 0) with the lowest measured ratio at ``concurrency``."""
        spec = [c for c in self.cells if c.concurrency == concurrency and c.k > 0]
        return min(spec, key=lambda c: (c.ratio, c.k)) if spec else None

    def rate_level(self, rate_per_s: float) -> DecisionRate | None:
        """The measured Poisson level covering ``rate_per_s``: the lowest at or above it (the
        costlier side), None beyond the highest."""
        above = [r for r in self.rates if not r.trace and r.rate_per_s >= rate_per_s]
        return min(above, key=lambda r: r.rate_per_s) if above else None

    def gate(self) -> ConcurrencyGate | None:
        """``max_draft_len`` + ``max_concurrency`` when the choices are one k then off."""
        return gate_from_choices(self.schedule)

    def draft_len_schedule(self, semantics: ScheduleSemantics) -> dict[int, int]:
        """The choices as an engine schedule: ``from`` = spectool's lower-bound form starting at
        1 (what :func:`spectool.trtllm.spec_yaml.render_speculative_yaml` takes), ``up_to`` =
        upper bounds (the embedded engine's and TensorRT-LLM main's form). ``{}``: never on."""
        return schedule_from_choices(self.schedule, semantics)

    def summary(self) -> dict[str, Any]:
        """What a build manifest records: the choices and every measured cell."""
        return {
            "engine": self.engine,
            "method": self.method,
            "max_draft_len": self.max_draft_len,
            "schedule": {str(c): k for c, k in sorted(self.schedule.items())},
            "break_even_concurrency": self.break_even_concurrency,
            "cells": [c.model_dump() for c in self.cells],
            "predicted": self.predicted,
            "prediction": self.prediction,
            "rates": [r.model_dump() for r in self.rates],
            "rates_objective": self.rates_objective,
        }


def _problem(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]


def parse_decision(data: Any, where: str | Path) -> Decision:
    """Validate a parsed ``decision.json`` object; :class:`BadInputError` naming ``where``."""
    if not isinstance(data, dict):
        raise BadInputError(where, "a decision must be a JSON object (spectool tune's output)")
    try:
        return Decision.model_validate(data)
    except ValidationError as exc:
        raise BadInputError(where, f"not a valid decision: {_problem(exc)}") from None


def read_decision(path: str | Path) -> tuple[Decision, bytes]:
    """Read ``decision.json``: the decision and the file's bytes (hashed into the manifest)."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise BadInputError(path, f"larger than {MAX_JSON_BYTES} bytes")
        raw = path.read_bytes()
    except OSError as exc:
        raise BadInputError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInputError(path, f"malformed JSON: {exc}") from None
    return parse_decision(data, path), raw
