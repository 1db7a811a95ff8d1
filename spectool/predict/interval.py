"""How far a predicted speed-up can be trusted: an 80 % interval from out-of-sample residuals.

The step-cost model's error is measured, not assumed: each source of ``tests/data/published``
is predicted with engine factors fitted without it (:func:`spectool.predict.loso.
leave_one_source_out`), and the 10th and 90th percentiles of ``log(published / predicted)`` over
those rows bound an 80 % interval around any prediction: ``speed-up x`` :data:`LOW_FACTOR` to
``speed-up x`` :data:`HIGH_FACTOR`. The factors below are that fit's, rounded outwards;
``tests/predict/test_interval.py`` recomputes them from the table and fails when they drift.

A verdict follows the interval, not the point: ``pays`` only when the whole interval is above
1, ``does not pay`` when it is below, else ``uncertain`` (measure it: ``spectool tune``).

The residuals come from GPU engines (TensorRT-LLM, vLLM, SGLang, HF eager); the embedded CPU
engine's own check (benchmarks/predict_cpu.py: +-20 % in all cells) is tighter, so the interval
is, if anything, wide there.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.8
# exp of the 10th / 90th percentile of log(published / predicted), leave-one-source-out over
# the 44 usable rows of tests/data/published (2026-12-04, rows whose batch the source does not
# state neither fitted nor judged: x0.771 and x1.067; with them fitted: x1.096).
LOW_FACTOR = 0.76
HIGH_FACTOR = 1.07

PAYS = "pays"
DOES_NOT_PAY = "does_not_pay"  # the spelling of tune's cell verdicts
UNCERTAIN = "uncertain"


@dataclass(frozen=True)
class Interval:
    """A predicted speed-up with its 80 % interval."""

    point: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        if self.low > 1.0:
            return PAYS
        if self.high < 1.0:
            return DOES_NOT_PAY
        return UNCERTAIN

    def __str__(self) -> str:
        return f"{self.point:.2f}x ({self.low:.2f}-{self.high:.2f})"


def interval(speedup: float, low: float = LOW_FACTOR, high: float = HIGH_FACTOR) -> Interval:
    """``speedup`` with its interval (the shipped factors unless given)."""
    return Interval(speedup, speedup * low, speedup * high)


def could_win(predicted_ratio: float, rival_ratio: float, high: float = HIGH_FACTOR) -> bool:
    """Whether a cell predicted at per-token ratio ``predicted_ratio`` (spec / base time per
    token, 1 / speed-up) could beat a rival at ``rival_ratio`` within its interval: its
    optimistic end, ``predicted_ratio / high``, is below the rival's. A search that prunes only
    cells for which this is False never prunes a cell the interval could win. tune's pruning
    (:mod:`spectool.decide.prune`) calls it with its own predictor's out-of-sample factor."""
    return predicted_ratio / high < rival_ratio


def residual_band(log_residuals: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """Multiplicative factors (low, high) covering the central ``level`` of
    ``log(published / predicted)`` residuals (linear interpolation between order statistics)."""
    if len(log_residuals) < 5:
        raise ValueError("need at least 5 residuals for an interval")
    tail = (1.0 - level) / 2.0
    qs = statistics.quantiles(sorted(log_residuals), n=1000, method="inclusive")
    lo = qs[round(tail * 1000) - 1]
    hi = qs[round((1.0 - tail) * 1000) - 1]
    return math.exp(lo), math.exp(hi)
