"""Replay tune's search on recorded grids, and judge its choices against brute force.

A *grid* is every ``(concurrency, k)`` cell for ``k = 0..N`` measured once: one pass of a
brute-force sweep. :func:`replay` takes each recorded grid in turn as tune's measurements (the
search asks for cells and gets that grid's), and judges the choices against all the *other*
grids pooled cell by cell (:func:`~spectool.decide.cell.pooled`). The same judgment of the
grid's own best cells shows what one brute-force pass would have chosen.

Judging (:func:`compare`, the proof's checks): at every concurrency the chosen ``k`` reaches at
least :data:`QUALITY` of the reference's best per-user tokens/s (1 / TPOT, pooled over requests);
and wherever the reference's best speculative cell differs from its baseline by more than
:data:`VERDICT_MARGIN`, the on/off choice agrees with it.

Recorded grids travel in a compact JSON file (:func:`write_grids` / :func:`read_grids`, format
``spectool.grids/1``, gzip when the name ends in ``.gz``): per cell only what the decision uses,
i.e. requests (send, first token, end, prompt and output tokens), decode steps (draft, verify,
coordination ms, batch, confirmed tokens), per-position acceptance counts and the wall time.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectool.decide.acceptance import PositionCounts
from spectool.decide.cell import CellMeasurement, IterationSample, pooled
from spectool.decide.cost import request_terms
from spectool.decide.latency import MS_PER_S, RequestRecord
from spectool.decide.tune import tune
from spectool.errors import BadInputError

QUALITY = 0.95  # share of the best per-user tokens/s the choice must reach
VERDICT_MARGIN = 0.05  # on/off is judged only where speculation changes tokens/s by more
GRIDS_FORMAT = "spectool.grids/1"

Key = tuple[int, int]
Grid = Mapping[Key, CellMeasurement]


def per_user_tokens_per_s(grid: Grid) -> dict[Key, float]:
    """Per-user tokens/s of every cell: ``1 / TPOT`` with TPOT pooled over the cell's requests
    (:func:`~spectool.decide.cost.request_terms`), as tune's report computes it."""
    out = {}
    for key, cell in grid.items():
        decode_ms, later_tokens = request_terms(cell.records)
        if not decode_ms.size or decode_ms.sum() <= 0:
            raise BadInputError(f"cell {key}", "no request with two tokens or more to time")
        out[key] = MS_PER_S * float(later_tokens.sum() / decode_ms.sum())
    return out


def compare(
    choices: Mapping[int, int], tps: Mapping[Key, float], concs: Sequence[int], n: int
) -> tuple[list[dict[str, Any]], bool, bool]:
    """``(rows, quality holds, verdicts hold)`` for ``choices`` against per-user tokens/s ``tps``."""
    rows = []
    quality_ok = verdict_ok = True
    for c in concs:
        best_k = max(range(n + 1), key=lambda k: tps[(c, k)])
        best_spec = max(range(1, n + 1), key=lambda k: tps[(c, k)])
        chosen = choices[c]
        share = tps[(c, chosen)] / tps[(c, best_k)]
        diff = tps[(c, best_spec)] / tps[(c, 0)] - 1.0
        agree = (chosen > 0) == (diff > 0) if abs(diff) > VERDICT_MARGIN else None
        quality_ok &= share >= QUALITY
        verdict_ok &= agree is not False
        rows.append(
            {
                "concurrency": c,
                "sweep_best_k": best_k,
                "sweep_best_spec_vs_off": diff,
                "chosen_k": chosen,
                "share_of_best": share,
                "verdict_agrees": agree,
                "sweep_tokens_per_s_per_user": {str(k): tps[(c, k)] for k in range(n + 1)},
            }
        )
    return rows, quality_ok, verdict_ok


def grid_shape(grids: Sequence[Grid]) -> tuple[tuple[int, ...], int]:
    """Concurrencies and largest ``k`` of the full grid every recorded grid holds."""
    if not grids:
        raise BadInputError("grids", "none given")
    keys = set(grids[0])
    concs = tuple(sorted({c for c, _ in keys}))
    n = max((k for _, k in keys), default=0)
    if n < 1 or keys != {(c, k) for c in concs for k in range(n + 1)}:
        raise BadInputError("grids", "the first grid is not a full grid of k = 0..N")
    if any(set(g) != keys for g in grids[1:]):
        raise BadInputError("grids", "the grids do not hold the same cells")
    return concs, n


@dataclass(frozen=True)
class Replay:
    """One grid replayed: tune's choices and the grid's own, judged against the other grids.

    ``measuring_share``: the measured cells' wall time over the whole grid's.
    """

    source: str
    choices: dict[int, int]
    rows: list[dict[str, Any]]
    quality: bool
    verdicts: bool
    own_rows: list[dict[str, Any]]
    measured: tuple[Key, ...]
    measuring_share: float

    @property
    def worst_share(self) -> float:
        return min(row["share_of_best"] for row in self.rows)

    @property
    def own_worst_share(self) -> float:
        return min(row["share_of_best"] for row in self.own_rows)

    @property
    def draft_lengths(self) -> int:
        """Distinct draft lengths measured: server starts."""
        return len({k for _, k in self.measured})


def replay(
    grids: Sequence[Grid], sources: Sequence[str], *, n_boot: int = 300, method: str = ""
) -> list[Replay]:
    """Replay tune's search once per grid (see the module docstring); needs two grids or more."""
    if len(grids) < 2 or len(sources) != len(grids):
        raise BadInputError("grids", "need two or more grids, one source name each")
    concs, n = grid_shape(grids)
    out = []
    for i, grid in enumerate(grids):
        reference = {key: pooled([g[key] for j, g in enumerate(grids) if j != i]) for key in grid}
        tps_ref = per_user_tokens_per_s(reference)
        result = tune(concs, n, lambda c, k, grid=grid: grid[(c, k)], method=method, n_boot=n_boot)
        rows, quality, verdicts = compare(result.choices, tps_ref, concs, n)
        tps_own = per_user_tokens_per_s(grid)
        own = {c: max(range(n + 1), key=lambda k, c=c: tps_own[(c, k)]) for c in concs}
        own_rows, _, _ = compare(own, tps_ref, concs, n)
        total = sum(cell.duration_s or 0.0 for cell in grid.values())
        used = sum(grid[key].duration_s or 0.0 for key in result.measured_now)
        out.append(
            Replay(
                source=sources[i],
                choices=dict(result.choices),
                rows=rows,
                quality=quality,
                verdicts=verdicts,
                own_rows=own_rows,
                measured=result.measured_now,
                measuring_share=used / total if total > 0 else float("nan"),
            )
        )
    return out


# -- the compact file --------------------------------------------------------------------------


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
    from spectool.io import atomic_write_bytes

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
