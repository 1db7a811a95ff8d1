"""Did the machine's speed change during the run? One cell measured again at the end.

Why: every ratio compares a speculative cell with a baseline measured earlier, minutes apart on
the same server settings. A machine shared with other work (or one that heats up and throttles)
runs slower or faster as time goes on, which shifts every ratio by the same factor and no
bootstrap interval sees it. So after the search, one cell measured early is run again and
compared with its first measurement: ``drift = per_token_end / per_token_start`` (decode ms per
token, from iteration stats when the server reports them, else client TPOT), with a percentile
bootstrap interval. Which cell (:func:`drift_reference`): the first one measured with the draft
length whose server is still running, when other draft lengths were measured after it (no extra
server start; greedy outputs repeat, so its acceptance does too); otherwise the baseline at the
smallest concurrency, whose choice gates the whole schedule. ``significant`` when the interval
excludes 1 and the change exceeds :data:`DRIFT_TOLERANCE`: the report then says the decision may
not hold on a quiet machine and suggests a rerun. Nothing is recomputed from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spectool.decide.cell import CellMeasurement
from spectool.decide.cost import (
    bootstrap_ratio_ci,
    default_block_len,
    iteration_terms,
    request_terms,
)

DRIFT_TOLERANCE = 0.05


@dataclass(frozen=True)
class Drift:
    """``ratio`` = decode ms per token at the end over at the start, with its interval."""

    concurrency: int
    k: int
    start_ms_per_token: float
    end_ms_per_token: float
    ratio: float
    ci_low: float
    ci_high: float

    @property
    def significant(self) -> bool:
        """The interval excludes 1 and the change is larger than :data:`DRIFT_TOLERANCE`."""
        outside = self.ci_low > 1.0 or self.ci_high < 1.0
        return outside and abs(self.ratio - 1.0) > DRIFT_TOLERANCE

    def to_json(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "k": self.k,
            "start_ms_per_token": self.start_ms_per_token,
            "end_ms_per_token": self.end_ms_per_token,
            "ratio": self.ratio,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "significant": self.significant,
        }

    def describe(self) -> str:
        change = f"{(self.ratio - 1.0):+.1%}"
        cell = "the baseline" if self.k == 0 else f"k={self.k}"
        return (
            f"{cell} at concurrency {self.concurrency} measured {self.start_ms_per_token:.3f} "
            f"ms/token at the start and {self.end_ms_per_token:.3f} at the end ({change}, CI "
            f"{self.ci_low:.3f}-{self.ci_high:.3f})"
        )


def drift_reference(
    measured: Sequence[tuple[int, int]], fallback: tuple[int, int]
) -> tuple[int, int]:
    """The cell to measure again (see the module docstring): ``measured`` in order, the last
    one's draft length being the server still running."""
    if not measured:
        return fallback
    last_k = measured[-1][1]
    first = next(i for i, (_, k) in enumerate(measured) if k == last_k)
    if any(k != last_k for _, k in measured[first:]):
        return measured[first]
    return fallback


def measure_drift(
    start: CellMeasurement, end: CellMeasurement, *, n_boot: int, confidence: float, seed: int
) -> Drift:
    """Compare two measurements of one cell (see the module docstring)."""
    if start.iterations and end.iterations:
        s_num, s_den = iteration_terms(start.iterations)
        e_num, e_den = iteration_terms(end.iterations)
        s_block, e_block = default_block_len(s_num.size), default_block_len(e_num.size)
    else:
        s_num, s_den = request_terms(start.records)
        e_num, e_den = request_terms(end.records)
        s_block = e_block = 1
    rng = np.random.default_rng([seed, start.concurrency, 9_999])
    ratio, low, high = bootstrap_ratio_ci(
        e_num,
        e_den,
        s_num,
        s_den,
        n_boot=n_boot,
        confidence=confidence,
        rng=rng,
        spec_block_len=e_block,
        base_block_len=s_block,
    )
    return Drift(
        concurrency=start.concurrency,
        k=start.k,
        start_ms_per_token=float(s_num.sum() / s_den.sum()),
        end_ms_per_token=float(e_num.sum() / e_den.sum()),
        ratio=ratio,
        ci_low=low,
        ci_high=high,
    )
