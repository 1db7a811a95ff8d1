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

Recorded grids are read and written by :mod:`spectool.measure.grids` (this module does no I/O).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spectool.decide.cell import CellMeasurement, pooled
from spectool.decide.cost import evaluate_cell, request_terms
from spectool.decide.latency import MS_PER_S
from spectool.decide.search import initial_plan
from spectool.decide.tune import tune
from spectool.decide.verdict import OBJECTIVES
from spectool.errors import BadInputError

QUALITY = 0.95  # share of the best per-user tokens/s the choice must reach
VERDICT_MARGIN = 0.05  # on/off is judged only where speculation changes tokens/s by more

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


def prediction_residuals(grids: Sequence[Grid], objective: str) -> list[float]:
    """``log(measured / predicted)`` of every cell tune's plan does not measure, each grid's
    predictions against the other grids pooled (``objective``: ``steps`` or ``tpot``): the
    out-of-sample error of tune's predictor (:data:`spectool.decide.prune.MEASURED_HIGH`)."""
    concs, n = grid_shape(grids)
    plan = set(initial_plan(concs, n))
    out = []
    for i, grid in enumerate(grids):
        result = tune(concs, n, lambda c, k, g=grid: g[(c, k)], n_boot=20, objective=objective)
        for p in result.predictions:
            key = (p.concurrency, p.k)
            if p.k == 0 or key in plan:
                continue
            spec = pooled([g[key] for j, g in enumerate(grids) if j != i])
            base = pooled([g[(p.concurrency, 0)] for j, g in enumerate(grids) if j != i])
            truth = evaluate_cell(spec, base, n_boot=10, source=OBJECTIVES[objective]).ratio
            out.append(math.log(truth / p.ratio))
    return out
