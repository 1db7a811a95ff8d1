"""Refit engine factors from measurements on the same machine (pure Python grid search).

:func:`fit_step_points`: measured ``(batch, tokens, step_ms)`` points of one model (a tune run's
cells: plain decode steps at ``tokens = 1``, verify forwards at ``k + 1``) -> the factors that
reproduce them, saying which were fitted and how well. :func:`fit_factors` is the general form
(any loss over :class:`EngineFactors`), used by the published-table check to refit engine-level
factors and to run its leave-one-source-out test.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from spectool.errors import BadInputError
from spectool.predict.cost import EngineFactors, Hardware, forward_cost
from spectool.predict.geometry import Geometry

# Grids searched by default: achieved fractions, then overheads (seconds).
DEFAULT_GRIDS: dict[str, tuple[float, ...]] = {
    "bw_fraction": (0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 1.0),
    "flops_fraction": (0.3, 0.4, 0.5, 0.6, 0.7, 0.8),
    "step_overhead_s": (0.0, 0.1e-3, 0.2e-3, 0.4e-3, 0.7e-3, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3),
    "spec_overhead_s": (0.0, 0.1e-3, 0.2e-3, 0.4e-3, 0.7e-3, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3),
    "layer_overhead_s": (0.0, 2e-6, 5e-6, 10e-6, 20e-6, 50e-6, 100e-6, 200e-6),
}


@dataclass(frozen=True)
class FitResult:
    """Fitted factors, which fields were fitted (the rest kept), and the loss reached."""

    factors: EngineFactors
    fitted: tuple[str, ...]
    loss: float
    points: int

    def describe(self) -> str:
        values = ", ".join(f"{n}={getattr(self.factors, n):.3g}" for n in self.fitted)
        return f"fitted {values} on {self.points} points (loss {self.loss:.3g})"


def fit_factors(
    base: EngineFactors,
    names: Sequence[str],
    loss: Callable[[EngineFactors], float],
    points: int,
    grids: Mapping[str, Sequence[float]] | None = None,
) -> FitResult:
    """The grid point over ``names`` (others as in ``base``) with the smallest ``loss``."""
    grids = {**DEFAULT_GRIDS, **(grids or {})}
    unknown = [n for n in names if n not in grids]
    if unknown:
        raise BadInputError("calibration", f"no grid for {', '.join(unknown)}")
    best: tuple[float, EngineFactors] | None = None
    for values in itertools.product(*(grids[n] for n in names)):
        candidate = replace(base, **dict(zip(names, values, strict=True)))
        value = loss(candidate)
        if best is None or value < best[0]:
            best = (value, candidate)
    assert best is not None
    fitted = replace(best[1], source=f"fitted ({', '.join(names)}) from {points} points")
    return FitResult(fitted, tuple(names), best[0], points)


def fit_step_points(
    geom: Geometry,
    hardware: Hardware,
    base: EngineFactors,
    points: Sequence[tuple[int, float, float]],
    context: float,
    tp: int = 1,
    names: Sequence[str] = ("bw_fraction", "flops_fraction", "layer_overhead_s"),
) -> FitResult:
    """Refit ``names`` so :func:`forward_cost` matches measured ``(batch, tokens, step_ms)``.

    Loss: median absolute log ratio (robust to a few noisy cells). Needs at least as many
    points as fitted names; fewer raise BadInputError.
    """
    if len(points) < len(names):
        raise BadInputError(
            "calibration", f"{len(points)} measured points cannot fit {len(names)} factors"
        )
    if any(ms <= 0 or b < 1 or t < 1 for b, t, ms in points):
        raise BadInputError("calibration", "points need batch >= 1, tokens >= 1, step_ms > 0")

    def loss(f: EngineFactors) -> float:
        return statistics.median(
            abs(math.log(forward_cost(geom, hardware, f, b, t, context, tp).seconds * 1e3 / ms))
            for b, t, ms in points
        )

    return fit_factors(base, names, loss, len(points))
