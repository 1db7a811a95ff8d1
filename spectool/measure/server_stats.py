"""Per-trial numbers from the server's polled iteration stats: what the decision math consumes.

Input: the :class:`~spectool.trtllm.iter_stats.IterationStats` polled during one trial (from
TensorRT-LLM's ``/metrics`` or spectool's server, which adds the ``spectoolStats`` extension).
Output: pooled sums (draft and accepted tokens), per-position counts, iteration-time
distributions, overall and per batch size (``numActiveRequests``), and the per-iteration
:class:`~spectool.decide.cell.IterationSample` list of a :class:`~spectool.decide.cell.CellMeasurement`.

Sums are taken before dividing: ``mean_acceptance_length = (sum accepted + sum requests with
draft) / sum requests with draft`` (TensorRT-LLM's ``acceptanceLength`` pooled over steps;
averaging per-iteration values would weight iterations, not steps).

Decode-step samples (:func:`iteration_samples`):

* with ``spectoolStats``: ``draft_ms``, ``verify_ms``, ``coord_ms`` as reported; the prefill
  of newly admitted requests is timed apart (``prefillMS``) and left out of the step;
* TensorRT-LLM: ``draft_ms`` = ``specDecodingStats.iterLatencyMS`` (0 for one-model drafters),
  ``verify_ms`` = ``iterLatencyMS - draft_ms``, ``coord_ms`` = 0. Iterations that also ran
  context (prefill) requests (``numContextRequests > 0``, or ``numNewActiveRequests > 0`` when
  the scheduler stats are absent) mix prefill into the step time and are left out unless
  ``include_mixed``.

The batch size of a step is ``inflightBatchingStats.numGenRequests`` when reported, else
``numActiveRequests``; its confirmed tokens are ``batch + numAcceptedTokens`` (each request gets
one token of the target's own plus its accepted drafts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from spectool.decide.acceptance import PositionCounts, acceptance_length
from spectool.decide.cell import CellMeasurement, IterationSample
from spectool.decide.latency import Distribution
from spectool.errors import BadInputError
from spectool.measure.runner import TrialResult
from spectool.trtllm.iter_stats import IterationStats


@dataclass(frozen=True)
class ServerStatsSummary:
    """Pooled iteration stats of a trial (or of one batch size within it); times in ms.

    ``spec_iterations`` counts iterations that drafted at least one token. ``accepted_per_pos`` /
    ``drafted_per_pos`` are summed ``spectoolStats`` counts (empty without the extension).
    ``step_ms`` is the decode-step time of :func:`iteration_samples`; ``draft_ms``,
    ``verify_ms``, ``coord_ms``, ``prefill_ms`` are per-iteration distributions from the
    extension (None without it). ``by_batch_size`` maps ``numActiveRequests`` to the same
    summary over those iterations only.
    """

    iterations: int
    spec_iterations: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_requests_with_draft_tokens: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    accepted_per_pos: tuple[int, ...]
    drafted_per_pos: tuple[int, ...]
    mean_active_requests: float | None
    iter_latency_ms: Distribution | None
    step_ms: Distribution | None
    draft_ms: Distribution | None
    verify_ms: Distribution | None
    coord_ms: Distribution | None
    prefill_ms: Distribution | None
    by_batch_size: dict[int, ServerStatsSummary] = field(default_factory=dict)

    def position_counts(self) -> PositionCounts | None:
        """Conditional per-position counts (:meth:`PositionCounts.from_drafted`); None without
        the extension or without drafts."""
        if not self.drafted_per_pos or not any(self.drafted_per_pos):
            return None
        return PositionCounts.from_drafted(self.accepted_per_pos, self.drafted_per_pos)


def _accepted(it: IterationStats) -> int:
    if it.spec_decoding is not None:
        return it.spec_decoding.num_accepted_tokens
    if it.spectool is not None:
        return sum(it.spectool.accepted_per_pos)
    return 0


def _batch_size(it: IterationStats) -> int:
    ifb = it.inflight_batching
    if ifb is not None and ifb.num_gen_requests is not None:
        return ifb.num_gen_requests
    return it.num_active_requests


def _is_mixed(it: IterationStats) -> bool:
    """Whether a TensorRT-LLM iteration also ran prefill (its time is not a pure decode step)."""
    ifb = it.inflight_batching
    if ifb is not None and ifb.num_context_requests is not None:
        return ifb.num_context_requests > 0
    return bool(it.num_new_active_requests)


def iteration_sample(it: IterationStats, *, include_mixed: bool = False) -> IterationSample | None:
    """The decode step of one iteration, or None when it had none (or mixed in a prefill)."""
    batch = _batch_size(it)
    if batch < 1:
        return None
    own = it.spectool
    if own is not None:
        draft, verify, coord = (v or 0.0 for v in (own.draft_ms, own.verify_ms, own.coord_ms))
        if draft + verify + coord <= 0.0:
            return None
    else:
        if _is_mixed(it) and not include_mixed:
            return None
        spec = it.spec_decoding
        draft = (spec.draft_latency_ms or 0.0) if spec is not None else 0.0
        draft = min(draft, it.iter_latency_ms)
        verify, coord = it.iter_latency_ms - draft, 0.0
    return IterationSample(draft, verify, coord, batch, batch + _accepted(it))


def iteration_samples(
    stats: Sequence[IterationStats], *, include_mixed: bool = False
) -> tuple[IterationSample, ...]:
    """Decode-step samples of every iteration that had one (see the module docstring)."""
    samples = (iteration_sample(it, include_mixed=include_mixed) for it in stats)
    return tuple(s for s in samples if s is not None)


def _sum_positions(vectors: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    width = max((len(v) for v in vectors), default=0)
    totals = [0] * width
    for v in vectors:
        for i, n in enumerate(v):
            totals[i] += n
    return tuple(totals)


def _summary(stats: Sequence[IterationStats], *, nested: bool) -> ServerStatsSummary:
    specs = [it.spec_decoding for it in stats if it.spec_decoding is not None]
    owns = [it.spectool for it in stats if it.spectool is not None]
    drafted = sum(s.num_draft_tokens for s in specs)
    accepted = sum(s.num_accepted_tokens for s in specs)
    with_draft = sum(s.num_requests_with_draft_tokens for s in specs)
    if not specs and owns:  # the extension alone still gives the counts
        drafted = sum(sum(o.drafted_per_pos) for o in owns)
        accepted = sum(sum(o.accepted_per_pos) for o in owns)
    samples = iteration_samples(stats)
    by_batch: dict[int, ServerStatsSummary] = {}
    if nested:
        groups: dict[int, list[IterationStats]] = {}
        for it in stats:
            groups.setdefault(it.num_active_requests, []).append(it)
        by_batch = {b: _summary(groups[b], nested=False) for b in sorted(groups)}

    def dist(values: Sequence[float | None]) -> Distribution | None:
        return Distribution.of(v for v in values if v is not None)

    return ServerStatsSummary(
        iterations=len(stats),
        spec_iterations=sum(1 for s in specs if s.num_draft_tokens > 0)
        or sum(1 for o in owns if any(o.drafted_per_pos)),
        num_draft_tokens=drafted,
        num_accepted_tokens=accepted,
        num_requests_with_draft_tokens=with_draft,
        acceptance_rate=accepted / drafted if drafted else None,
        mean_acceptance_length=acceptance_length(accepted, with_draft),
        accepted_per_pos=_sum_positions([o.accepted_per_pos for o in owns]),
        drafted_per_pos=_sum_positions([o.drafted_per_pos for o in owns]),
        mean_active_requests=(
            sum(it.num_active_requests for it in stats) / len(stats) if stats else None
        ),
        iter_latency_ms=dist([it.iter_latency_ms for it in stats]),
        step_ms=dist([s.step_ms for s in samples]),
        draft_ms=dist([o.draft_ms for o in owns]),
        verify_ms=dist([o.verify_ms for o in owns]),
        coord_ms=dist([o.coord_ms for o in owns]),
        prefill_ms=dist([o.prefill_ms for o in owns]),
        by_batch_size=by_batch,
    )


def summarize_iterations(stats: Sequence[IterationStats]) -> ServerStatsSummary:
    """Pool a trial's iteration stats, overall and per ``numActiveRequests``."""
    return _summary(list(stats), nested=True)


def to_cell(
    result: TrialResult, k: int, *, include_mixed: bool = False, level: int | None = None
) -> CellMeasurement:
    """A trial as the decision math's cell at draft length ``k`` (0 = baseline).

    Only successful requests go in; per-position counts come from the ``spectoolStats``
    extension when present. A closed-loop trial's cell is keyed by its concurrency; an
    open-loop (rate) trial has none, so the caller names the load level it stands for
    (``level``: :mod:`spectool.tuning.rates` passes the server's batch limit).
    """
    if result.config.concurrency is None and level is None:
        raise BadInputError(
            f"trial {result.config.label!r}", "an open-loop (rate) trial is not a cell"
        )
    concurrency = result.config.concurrency if result.config.concurrency is not None else level
    assert concurrency is not None
    summary = summarize_iterations(result.iteration_stats)
    positions = summary.position_counts() if k > 0 else None
    if positions is not None and positions.max_draft_len > k:
        trimmed = positions.accepted_per_pos[k:] + positions.reached_per_pos[k:]
        if any(trimmed):
            raise BadInputError(
                f"trial {result.config.label!r}",
                f"acceptance counted at {positions.max_draft_len} positions for draft length {k}",
            )
        positions = PositionCounts(positions.accepted_per_pos[:k], positions.reached_per_pos[:k])
    return CellMeasurement(
        concurrency=concurrency,
        k=k,
        records=tuple(r for r in result.records if r.ok),
        iterations=iteration_samples(result.iteration_stats, include_mixed=include_mixed),
        positions=positions,
        duration_s=result.wall_time_s,
    )
