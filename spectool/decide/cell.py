"""What one measured (concurrency, draft length) cell holds: the input of every decision.

A cell is one run of the server at a fixed client concurrency with speculation at draft length
``k`` (``k = 0``: speculation off, the baseline). It carries whatever the engine and client could
see: per-request records (always, from the client), per-iteration samples (when the server
reports iteration stats, e.g. TensorRT-LLM ``/metrics`` with ``enable_iter_perf_stats``) and
per-position acceptance counts (when the engine exports them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spectool.decide.acceptance import PositionCounts
from spectool.decide.latency import RequestRecord
from spectool.errors import BadInputError


@dataclass(frozen=True)
class IterationSample:
    """One engine iteration (one verify step for every generation request in the batch).

    ``draft_ms + verify_ms + coord_ms`` is the step time; the split is informative only (the
    TensorRT-LLM adapter maps ``specDecodingStats.iterLatencyMS`` to ``draft_ms`` and the rest of
    ``iterLatencyMS`` to ``verify_ms``). ``batch_size`` counts generation requests in the step;
    ``confirmed_tokens`` is the sum over those requests of the tokens the step confirmed for them
    (accepted drafts plus one correction/bonus token each, so ``>= batch_size``; ``== batch_size``
    without speculation). For TensorRT-LLM: ``numGenRequests + numAcceptedTokens``.
    """

    draft_ms: float
    verify_ms: float
    coord_ms: float
    batch_size: int
    confirmed_tokens: int

    def __post_init__(self) -> None:
        where = "iteration sample"
        if min(self.draft_ms, self.verify_ms, self.coord_ms) < 0:
            raise BadInputError(where, "times must be >= 0 ms")
        if self.batch_size < 1:
            raise BadInputError(where, f"batch_size must be >= 1, got {self.batch_size}")
        if self.confirmed_tokens < self.batch_size:
            raise BadInputError(
                where,
                f"{self.confirmed_tokens} confirmed tokens for {self.batch_size} requests: every "
                "request confirms at least one token per step",
            )

    @classmethod
    def from_per_request(
        cls,
        draft_ms: float,
        verify_ms: float,
        coord_ms: float,
        confirmed_per_request: Sequence[int],
    ) -> IterationSample:
        """Build from the confirmed tokens of each request in the batch."""
        return cls(
            draft_ms,
            verify_ms,
            coord_ms,
            len(confirmed_per_request),
            int(sum(confirmed_per_request)),
        )

    @property
    def step_ms(self) -> float:
        """Draft + verify + coordination time of the step."""
        return self.draft_ms + self.verify_ms + self.coord_ms


@dataclass(frozen=True)
class CellMeasurement:
    """Everything measured in one (concurrency, k) run; see the module docstring.

    ``duration_s`` is the run's wall time (for throughput); None when unknown.
    """

    concurrency: int
    k: int
    records: tuple[RequestRecord, ...] = ()
    iterations: tuple[IterationSample, ...] = ()
    positions: PositionCounts | None = None
    duration_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "records", tuple(self.records))
        object.__setattr__(self, "iterations", tuple(self.iterations))
        where = f"cell (concurrency={self.concurrency}, k={self.k})"
        if self.concurrency < 1 or self.k < 0:
            raise BadInputError(where, "need concurrency >= 1 and k >= 0")
        if self.positions is not None and self.positions.max_draft_len > max(self.k, 0):
            raise BadInputError(
                where,
                f"{self.positions.max_draft_len} acceptance positions for draft length {self.k}",
            )
        if self.k == 0 and any(s.confirmed_tokens != s.batch_size for s in self.iterations):
            raise BadInputError(where, "a baseline step confirmed more than one token per request")

    @property
    def key(self) -> tuple[int, int]:
        """``(concurrency, k)``."""
        return (self.concurrency, self.k)

    def tokens_per_step(self) -> float | None:
        """Measured confirmed tokens per request-step: iterations first, else acceptance counts.

        From iterations ``sum(confirmed_tokens) / sum(batch_size)``; from counts
        ``1 + sum(accepted) / steps``; 1.0 for the baseline; None when neither is known.
        """
        if self.k == 0:
            return 1.0
        if self.iterations:
            return sum(s.confirmed_tokens for s in self.iterations) / sum(
                s.batch_size for s in self.iterations
            )
        if self.positions is not None:
            return self.positions.mean_tokens_per_step()
        return None

    def mean_batch_size(self) -> float | None:
        """Mean generation batch over iterations (unweighted); None without iteration samples."""
        if not self.iterations:
            return None
        return sum(s.batch_size for s in self.iterations) / len(self.iterations)

    def mean_step_ms(self) -> float | None:
        """Mean step time over iterations (unweighted); None without iteration samples."""
        if not self.iterations:
            return None
        return sum(s.step_ms for s in self.iterations) / len(self.iterations)


def pooled(cells: Sequence[CellMeasurement]) -> CellMeasurement:
    """One cell from several measurements of the same ``(concurrency, k)`` (repeats, or sweeps
    recorded at different times): requests, steps and acceptance counts of all, durations
    summed (unknown durations count as 0)."""
    if not cells:
        raise BadInputError("cell", "nothing to pool")
    key = cells[0].key
    if any(c.key != key for c in cells):
        raise BadInputError("cell", f"cannot pool cells of different (concurrency, k) with {key}")
    positions: PositionCounts | None = None
    for cell in cells:
        if cell.positions is not None:
            positions = cell.positions if positions is None else positions.merged(cell.positions)
    return CellMeasurement(
        concurrency=key[0],
        k=key[1],
        records=tuple(r for c in cells for r in c.records),
        iterations=tuple(s for c in cells for s in c.iterations),
        positions=positions,
        duration_s=sum(c.duration_s or 0.0 for c in cells),
    )
