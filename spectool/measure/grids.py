"""Recorded grids (see :mod:`spectool.decide.replay`) in a compact JSON file.

Format ``spectool.grids/1``, gzip when the name ends in ``.gz``: per cell only what the
decision uses, i.e. requests (send, first token, end, prompt and output tokens), decode steps
(draft, verify, coordination ms, batch, confirmed tokens), per-position acceptance counts and
the wall time.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spectool.decide.acceptance import PositionCounts
from spectool.decide.cell import CellMeasurement, IterationSample
from spectool.decide.latency import RequestRecord
from spectool.decide.replay import Grid, Key
from spectool.errors import BadInputError
from spectool.io import atomic_write_bytes

GRIDS_FORMAT = "spectool.grids/1"


def _cell_to_json(cell: CellMeasurement) -> dict[str, Any]:
    """Request times relative to the cell's first send, to the microsecond; step times to the
    microsecond too (what the decision reads is far coarser)."""
    t0 = min((r.send_time_s for r in cell.records), default=0.0)

    def t(value: float | None) -> float | None:
        return None if value is None else round(value - t0, 6)

    return {
        "concurrency": cell.concurrency,
        "k": cell.k,
        "duration_s": None if cell.duration_s is None else round(cell.duration_s, 6),
        "requests": [
            [
                t(r.send_time_s),
                t(r.first_token_time_s),
                t(r.end_time_s),
                r.prompt_tokens,
                r.output_tokens,
            ]
            for r in cell.records
        ],
        "steps": [
            [
                round(s.draft_ms, 3),
                round(s.verify_ms, 3),
                round(s.coord_ms, 3),
                s.batch_size,
                s.confirmed_tokens,
            ]
            for s in cell.iterations
        ],
        "positions": None
        if cell.positions is None
        else [list(cell.positions.accepted_per_pos), list(cell.positions.reached_per_pos)],
    }


def _cell_from_json(obj: Mapping[str, Any]) -> CellMeasurement:
    c, k = int(obj["concurrency"]), int(obj["k"])
    records = tuple(
        RequestRecord(
            request_id=f"{c},{k},{i}",
            category="",
            send_time_s=float(send),
            first_token_time_s=None if first is None else float(first),
            chunk_times_s=(),
            chunk_token_counts=(),
            end_time_s=float(end),
            prompt_tokens=int(prompt),
            output_tokens=int(output),
        )
        for i, (send, first, end, prompt, output) in enumerate(obj["requests"])
    )
    steps = tuple(
        IterationSample(float(d), float(v), float(co), int(b), int(t))
        for d, v, co, b, t in obj["steps"]
    )
    positions = obj.get("positions")
    return CellMeasurement(
        concurrency=c,
        k=k,
        records=records,
        iterations=steps,
        positions=None if positions is None else PositionCounts(*positions),
        duration_s=obj.get("duration_s"),
    )


def write_grids(
    path: str | Path, grids: Sequence[Grid], sources: Sequence[str], meta: Mapping[str, Any]
) -> None:
    """Write recorded grids (and free-form ``meta``: pair, setup, workload) to ``path``."""
    data = {
        "format": GRIDS_FORMAT,
        "meta": dict(meta),
        "grids": [
            {"source": source, "cells": [_cell_to_json(grid[key]) for key in sorted(grid)]}
            for grid, source in zip(grids, sources, strict=True)
        ],
    }
    raw = json.dumps(data, separators=(",", ":")).encode()
    path = Path(path)
    atomic_write_bytes(
        path, gzip.compress(raw, mtime=0) if path.suffix == ".gz" else raw, force=True
    )


def read_grids(
    path: str | Path,
) -> tuple[list[dict[Key, CellMeasurement]], list[str], dict[str, Any]]:
    """``(grids, sources, meta)`` from a file written by :func:`write_grids`."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        data = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    except (OSError, ValueError) as exc:
        raise BadInputError(path, f"cannot read recorded grids: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != GRIDS_FORMAT:
        raise BadInputError(path, f"not a {GRIDS_FORMAT} file")
    try:
        grids = [
            {(cell.concurrency, cell.k): cell for cell in map(_cell_from_json, g["cells"])}
            for g in data["grids"]
        ]
        sources = [str(g["source"]) for g in data["grids"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInputError(path, f"malformed recorded grid: {exc}") from None
    return grids, sources, dict(data.get("meta") or {})
