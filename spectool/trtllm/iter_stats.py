"""Parse TensorRT-LLM's ``GET /metrics`` iteration statistics into frozen records.

``/metrics`` returns a JSON **list**, one object per engine iteration, drained from a bounded
queue when read (poll often, keep what you read). The object is the C++ ``IterationStats``
serialized with camelCase keys; field names follow
``cpp/include/tensorrt_llm/executor/types.h`` (NVIDIA/TensorRT-LLM: structs ``IterationStats``,
``KvCacheStats``, ``InflightBatchingStats``, ``SpecDecodingStats``). The PyTorch backend fills it
only with ``enable_iter_perf_stats: true``.

``specDecodingStats`` semantics (PyTorch executor): ``acceptanceLength`` = (accepted +
requests with drafts) / requests with drafts, i.e. tokens per step including the bonus token;
``iterLatencyMS`` is the **draft** latency and is filled only by two-model drafters (0 for
one-model Eagle3/MTP), so ``draftOverhead`` (= draft ms / iteration ms) is 0 there too.

``spectoolStats`` is spectool's own extension, written by spectool's embedded server (never by
TensorRT-LLM): per-position accepted/drafted counts and a draft/verify/coordination/prefill time
split of the iteration, in milliseconds.

Parsing is tolerant of missing optional keys (older or newer servers add and drop fields) and
strict on wrong types: a present key with the wrong type or a negative count is a
:class:`BadInputError` naming ``[index].path.key``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spectool.errors import BadInputError


@dataclass(frozen=True)
class KvCacheStats:
    """KV-cache block counts of one iteration (``kvCacheStats``)."""

    max_num_blocks: int | None
    free_num_blocks: int | None
    used_num_blocks: int | None
    tokens_per_block: int | None
    alloc_total_blocks: int | None
    alloc_new_blocks: int | None
    reused_blocks: int | None
    missed_blocks: int | None
    cache_hit_rate: float | None


@dataclass(frozen=True)
class InflightBatchingStats:
    """Scheduler view of one iteration (``inflightBatchingStats``)."""

    num_scheduled_requests: int | None
    num_context_requests: int | None
    num_gen_requests: int | None
    num_paused_requests: int | None
    num_ctx_tokens: int | None
    micro_batch_id: int | None
    avg_num_decoded_tokens_per_iter: float | None


@dataclass(frozen=True)
class SpecDecodingStats:
    """Speculation counters of one iteration (``specDecodingStats``).

    ``acceptance_length`` is tokens per step including the bonus token; ``draft_latency_ms`` is
    the drafting time (``iterLatencyMS`` inside ``specDecodingStats``, 0 for one-model drafters).
    """

    num_draft_tokens: int
    num_accepted_tokens: int
    num_requests_with_draft_tokens: int
    acceptance_length: float | None
    draft_latency_ms: float | None
    draft_overhead: float | None

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens of this iteration (None when nothing was drafted)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None


@dataclass(frozen=True)
class SpectoolStats:
    """spectool's extension (``spectoolStats``): per-position counts and a time split, in ms.

    ``accepted_per_pos[i]`` counts drafts whose token at position i was accepted,
    ``drafted_per_pos[i]`` drafts that had a token at position i; ``draft_len`` is the draft
    length used in the iteration.
    """

    accepted_per_pos: tuple[int, ...]
    drafted_per_pos: tuple[int, ...]
    draft_ms: float | None
    verify_ms: float | None
    coord_ms: float | None
    prefill_ms: float | None
    draft_len: int | None


@dataclass(frozen=True)
class IterationStats:
    """One engine iteration as reported by ``/metrics``; latencies in milliseconds."""

    iter: int | None
    timestamp: str | None
    iter_latency_ms: float
    num_active_requests: int
    num_queued_requests: int | None
    num_new_active_requests: int | None
    num_completed_requests: int | None
    max_num_active_requests: int | None
    new_active_requests_queue_latency_ms: float | None
    gpu_mem_usage_bytes: int | None
    kv_cache: KvCacheStats | None
    inflight_batching: InflightBatchingStats | None
    spec_decoding: SpecDecodingStats | None
    spectool: SpectoolStats | None


class _Reader:
    """Typed access to one JSON object; every error names ``where`` and the key path."""

    def __init__(self, obj: Any, where: str, path: str) -> None:
        if not isinstance(obj, Mapping):
            raise BadInputError(where, f"{path}: expected an object, got {_kind(obj)}")
        self.obj, self.where, self.path = obj, where, path

    def _bad(self, key: str, problem: str) -> BadInputError:
        return BadInputError(self.where, f"{self.path}.{key}: {problem}")

    def _get(self, key: str, required: bool) -> Any:
        if key not in self.obj or self.obj[key] is None:
            if required:
                raise self._bad(key, "missing")
            return None
        return self.obj[key]

    def int_(self, key: str, *, required: bool = False) -> int | None:
        value = self._get(key, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(key, f"expected an integer, got {_kind(value)} {value!r}")
        if value < 0:
            raise self._bad(key, f"must be >= 0, got {value}")
        return value

    def float_(self, key: str, *, required: bool = False) -> float | None:
        value = self._get(key, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._bad(key, f"expected a number, got {_kind(value)} {value!r}")
        if value != value or value < 0:  # NaN or negative
            raise self._bad(key, f"must be a number >= 0, got {value}")
        return float(value)

    def need_int(self, key: str) -> int:
        value = self.int_(key, required=True)
        assert value is not None  # required=True raised otherwise
        return value

    def need_float(self, key: str) -> float:
        value = self.float_(key, required=True)
        assert value is not None  # required=True raised otherwise
        return value

    def str_(self, key: str) -> str | None:
        value = self._get(key, False)
        if value is not None and not isinstance(value, str):
            raise self._bad(key, f"expected a string, got {_kind(value)}")
        return value

    def counts(self, key: str) -> tuple[int, ...]:
        value = self._get(key, False)
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self._bad(key, f"expected a list of integers, got {_kind(value)}")
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int) or item < 0:
                raise self._bad(f"{key}[{i}]", f"expected an integer >= 0, got {item!r}")
        return tuple(value)

    def sub(self, key: str) -> _Reader | None:
        value = self._get(key, False)
        return None if value is None else _Reader(value, self.where, f"{self.path}.{key}")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    return {dict: "object", list: "list", str: "string"}.get(type(value), type(value).__name__)


def _kv(r: _Reader) -> KvCacheStats:
    return KvCacheStats(
        max_num_blocks=r.int_("maxNumBlocks"),
        free_num_blocks=r.int_("freeNumBlocks"),
        used_num_blocks=r.int_("usedNumBlocks"),
        tokens_per_block=r.int_("tokensPerBlock"),
        alloc_total_blocks=r.int_("allocTotalBlocks"),
        alloc_new_blocks=r.int_("allocNewBlocks"),
        reused_blocks=r.int_("reusedBlocks"),
        missed_blocks=r.int_("missedBlocks"),
        cache_hit_rate=r.float_("cacheHitRate"),
    )


def _ifb(r: _Reader) -> InflightBatchingStats:
    return InflightBatchingStats(
        num_scheduled_requests=r.int_("numScheduledRequests"),
        num_context_requests=r.int_("numContextRequests"),
        num_gen_requests=r.int_("numGenRequests"),
        num_paused_requests=r.int_("numPausedRequests"),
        num_ctx_tokens=r.int_("numCtxTokens"),
        micro_batch_id=r.int_("microBatchId"),
        avg_num_decoded_tokens_per_iter=r.float_("avgNumDecodedTokensPerIter"),
    )


def _spec(r: _Reader) -> SpecDecodingStats:
    drafted = r.need_int("numDraftTokens")
    accepted = r.need_int("numAcceptedTokens")
    if accepted > drafted:
        raise BadInputError(
            r.where, f"{r.path}: numAcceptedTokens {accepted} > numDraftTokens {drafted}"
        )
    return SpecDecodingStats(
        num_draft_tokens=drafted,
        num_accepted_tokens=accepted,
        num_requests_with_draft_tokens=r.int_("numRequestsWithDraftTokens") or 0,
        acceptance_length=r.float_("acceptanceLength"),
        draft_latency_ms=r.float_("iterLatencyMS"),
        draft_overhead=r.float_("draftOverhead"),
    )


def _spectool(r: _Reader) -> SpectoolStats:
    accepted = r.counts("acceptedPerPos")
    drafted = r.counts("draftedPerPos")
    if len(accepted) != len(drafted):
        raise BadInputError(
            r.where,
            f"{r.path}: acceptedPerPos has {len(accepted)} positions, draftedPerPos {len(drafted)}",
        )
    for i, (a, d) in enumerate(zip(accepted, drafted, strict=True)):
        if a > d:
            raise BadInputError(r.where, f"{r.path}.acceptedPerPos[{i}]: {a} > drafted {d}")
    return SpectoolStats(
        accepted_per_pos=accepted,
        drafted_per_pos=drafted,
        draft_ms=r.float_("draftMS"),
        verify_ms=r.float_("verifyMS"),
        coord_ms=r.float_("coordMS"),
        prefill_ms=r.float_("prefillMS"),
        draft_len=r.int_("draftLen"),
    )


def parse_iteration(obj: Any, *, where: str = "/metrics", index: int = 0) -> IterationStats:
    """One ``/metrics`` list entry; ``iterLatencyMS`` and ``numActiveRequests`` are required."""
    r = _Reader(obj, where, f"[{index}]")
    latency = r.need_float("iterLatencyMS")
    active = r.need_int("numActiveRequests")
    kv, ifb, spec, own = (
        r.sub(k)
        for k in ("kvCacheStats", "inflightBatchingStats", "specDecodingStats", "spectoolStats")
    )
    return IterationStats(
        iter=r.int_("iter"),
        timestamp=r.str_("timestamp"),
        iter_latency_ms=latency,
        num_active_requests=active,
        num_queued_requests=r.int_("numQueuedRequests"),
        num_new_active_requests=r.int_("numNewActiveRequests"),
        num_completed_requests=r.int_("numCompletedRequests"),
        max_num_active_requests=r.int_("maxNumActiveRequests"),
        new_active_requests_queue_latency_ms=r.float_("newActiveRequestsQueueLatencyMS"),
        gpu_mem_usage_bytes=r.int_("gpuMemUsage"),
        kv_cache=_kv(kv) if kv else None,
        inflight_batching=_ifb(ifb) if ifb else None,
        spec_decoding=_spec(spec) if spec else None,
        spectool=_spectool(own) if own else None,
    )


def parse_iteration_stats(payload: Any, *, where: str = "/metrics") -> list[IterationStats]:
    """The decoded ``/metrics`` body (a JSON list) as records, in server order."""
    if not isinstance(payload, Sequence) or isinstance(payload, (str, bytes)):
        raise BadInputError(where, f"expected a JSON list of iteration stats, got {_kind(payload)}")
    return [parse_iteration(obj, where=where, index=i) for i, obj in enumerate(payload)]


def parse_iteration_stats_json(
    text: str | bytes, *, where: str = "/metrics"
) -> list[IterationStats]:
    """:func:`parse_iteration_stats` on the raw response body."""
    try:
        payload = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInputError(where, f"not valid JSON: {exc}") from exc
    return parse_iteration_stats(payload, where=where)
