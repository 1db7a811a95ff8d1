"""Inputs from a ``tune`` run's ``tune.json``: measured acceptance and step points.

* :func:`acceptance_from_tune`: per-position acceptance pooled over the speculative cells (all,
  or one concurrency's), the best acceptance input there is (valid for every ``k`` up to the
  longest measured).
* :func:`step_points_from_tune`: ``(batch, tokens, verify_ms)`` per measured decode step, for
  :func:`~spectool.predict.calibrate.fit_step_points` (the target forward of ``k + 1`` tokens;
  plain decode at ``tokens = 1``). spectool's engine splits draft/verify/coordination; for
  TensorRT-LLM the verify figure holds the whole step but the draft (see
  :class:`spectool.decide.cell.IterationSample`).

The format is ``tune.json`` ``spectool.tune/1`` (:mod:`spectool.tuning.record`); malformed files
raise a one-line :class:`~spectool.errors.BadInputError` naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spectool.errors import BadInputError
from spectool.predict.acceptance import Acceptance


def _cells(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInputError(path, f"cannot read tune.json: {exc}") from exc
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        raise BadInputError(path, "no 'cells' list: not a spectool tune.json")
    return cells


def acceptance_from_tune(path: Path, concurrency: int | None = None) -> Acceptance:
    """Per-position acceptance pooled over the cells of ``tune.json`` that measured it."""
    accepted: list[int] = []
    reached: list[int] = []
    used = 0
    for cell in _cells(path):
        if concurrency is not None and cell.get("concurrency") != concurrency:
            continue
        positions = (cell.get("raw") or {}).get("positions")
        if not positions:
            continue
        try:
            acc = [int(a) for a in positions["accepted_per_pos"]]
            rea = [int(r) for r in positions["reached_per_pos"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInputError(path, f"malformed positions in a cell: {exc}") from exc
        if len(acc) != len(rea) or any(a > r or a < 0 for a, r in zip(acc, rea, strict=True)):
            raise BadInputError(path, "positions: accepted exceeds reached or lengths differ")
        n = max(len(accepted), len(acc))
        accepted = [x + y for x, y in zip(_pad(accepted, n), _pad(acc, n), strict=True)]
        reached = [x + y for x, y in zip(_pad(reached, n), _pad(rea, n), strict=True)]
        used += 1
    where = f" at concurrency {concurrency}" if concurrency is not None else ""
    if not used or not reached or not reached[0]:
        raise BadInputError(path, f"no per-position acceptance measured{where}")
    # positions never reached carry no information: stop before the first one
    last = next((i for i, r in enumerate(reached) if r == 0), len(reached))
    alphas = [a / r for a, r in zip(accepted[:last], reached[:last], strict=True)]
    return Acceptance.from_alphas(alphas, f"tune.json: {used} cells{where}, k <= {last}")


def _pad(values: list[int], n: int) -> list[int]:
    return values + [0] * (n - len(values))


def step_points_from_tune(path: Path) -> list[tuple[int, float, float]]:
    """``(batch, tokens per sequence, verify ms)`` for every decode step of every cell."""
    points: list[tuple[int, float, float]] = []
    for cell in _cells(path):
        try:
            k = int(cell["k"])
            for it in (cell.get("raw") or {}).get("iterations") or []:
                batch = int(it["batch_size"])
                if batch > 0:
                    points.append((batch, float(k + 1), float(it["verify_ms"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInputError(path, f"malformed cell: {exc}") from exc
    if not points:
        raise BadInputError(path, "no decode steps in any cell")
    return points
