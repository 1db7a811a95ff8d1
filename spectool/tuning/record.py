"""``DIR/tune.json``: every measurement the decision used, the fitted model, and the decision.

Why a second file beside ``trials.jsonl``: the trials are the raw wire-level record (chunk times,
``/metrics`` payloads) and enough to redo everything; ``tune.json`` is what the decision
consumed, cell by cell, in the decision math's own terms, so a reader (or a script) can check the
verdicts without spectool:

* ``cells``: per measured (concurrency, k) cell its trial labels, whether it was measured in this
  run or reused from an earlier one, the cost-inequality verdict (every field of
  :class:`~spectool.decide.cost.CellVerdict`), the latency/throughput summary
  (:class:`~spectool.decide.stats.CellStats`) and the raw inputs: per request (send, first token,
  end, tokens), per decode step (draft/verify/coord ms, batch, confirmed tokens) and per-position
  acceptance counts;
* ``cost_model``, ``predictions`` (every cell of the grid), ``prediction_checks`` (predicted
  against measured), ``predicted_choices``;
* ``decision``: exactly ``decision.json``; ``runs``: cells used against the full grid.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import spectool
from spectool.decide.cell import CellMeasurement
from spectool.io import atomic_write_text
from spectool.tuning.outcome import TuneOutcome
from spectool.tuning.pairing import look_every, looks_of, max_pairs
from spectool.tuning.setup import TUNE_NAME
from spectool.tuning.trials import BLOCK_WAVES, pass_pairs

TUNE_FORMAT = "spectool.tune/1"


def _raw(cell: CellMeasurement) -> dict[str, Any]:
    return {
        "duration_s": cell.duration_s,
        "requests": [
            {
                "request_id": r.request_id,
                "category": r.category,
                "send_time_s": r.send_time_s,
                "first_token_time_s": r.first_token_time_s,
                "end_time_s": r.end_time_s,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "chunks": len(r.chunk_times_s),
            }
            for r in cell.records
        ],
        "iterations": [dataclasses.asdict(s) for s in cell.iterations],
        "positions": (
            None
            if cell.positions is None
            else {
                "accepted_per_pos": list(cell.positions.accepted_per_pos),
                "reached_per_pos": list(cell.positions.reached_per_pos),
            }
        ),
    }


def tune_json(outcome: TuneOutcome) -> dict[str, Any]:
    """The ``tune.json`` object (see the module docstring)."""
    result, resolved = outcome.result, outcome.resolved
    req = resolved.request
    verdicts = {(v.concurrency, v.k): v for v in result.cells}
    measured_now = set(result.measured_now)
    cells = []
    for key, cell in sorted(outcome.cells.items()):
        c, k = key
        verdict = verdicts.get(key)
        cells.append(
            {
                "concurrency": c,
                "k": k,
                "measured_now": key in measured_now,
                "verdict": (
                    {**dataclasses.asdict(verdict), "design": verdict.design}
                    if verdict is not None
                    else None
                ),
                "stats": outcome.stats[key].to_json() if key in outcome.stats else None,
                "raw": _raw(cell),
            }
        )
    model = result.cost_model
    return {
        "format": TUNE_FORMAT,
        "spectool_version": spectool.__version__,
        "setup": outcome.setup.to_json(),
        "search": {
            "concurrencies": list(result.concurrencies),
            "max_draft_len": result.searched_max_draft_len,
            "repeats": req.repeats,
            "requests_per_trial": {
                str(c): max(resolved.num_prompts, 2 * c) for c in result.concurrencies
            },
            "max_tokens": resolved.max_tokens,
            "confidence": req.confidence,
            "n_boot": req.n_boot,
            "seed": req.seed,
            "min_gain": req.min_gain,
            "objective": req.objective,  # what decided (goodput: with its SLO)
            "pairing": {
                "budget_s": req.budget_s,
                "block_waves": BLOCK_WAVES,
                "workload_prompts": len(outcome.prompts.prompts),
                "per_concurrency": {
                    str(c): {
                        "pass_pairs": (p := pass_pairs(len(outcome.prompts.prompts), c)),
                        "look_every": look_every(p),
                        "max_pairs": max_pairs(p),
                        "looks": looks_of(p),
                    }
                    for c in result.concurrencies
                },
            },
        },
        "workload": outcome.prompts.to_json(),
        "runs": {
            "used": result.runs_used,
            "full_grid": result.full_grid_runs,
            "measured_now": [list(key) for key in result.measured_now],
            "reused": [list(key) for key in result.reused],
            "trials_measured_now": outcome.trials_measured_now,
            "server_starts": outcome.server_starts,
        },
        "timing": {"wall_s": outcome.wall_s, "measure_s": outcome.measure_s},
        "measurement": outcome.servers,
        "cells": cells,
        "cost_model": (
            None if model is None else {**dataclasses.asdict(model), "fitted": list(model.fitted)}
        ),
        "predictions": [dataclasses.asdict(p) for p in result.predictions],
        "prediction_checks": [dataclasses.asdict(p) for p in result.checks],
        "predicted_choices": {str(c): k for c, k in sorted(result.predicted_choices.items())},
        "decision": result.to_decision_json(),
        "files": [str(p) for p in outcome.files],
        "notes": list(outcome.notes),
    }


def _finite(obj: Any) -> Any:
    """``obj`` with non-finite floats as None (JSON has no NaN or infinity)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: _finite(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(value) for value in obj]
    return obj


def write_tune_json(outcome: TuneOutcome) -> Path:
    """Write ``DIR/tune.json`` atomically; returns its path."""
    text = json.dumps(_finite(tune_json(outcome)), indent=1, allow_nan=False) + "\n"
    return atomic_write_text(outcome.out / TUNE_NAME, text)
