"""Engine iteration stats -> the JSON objects TensorRT-LLM's ``GET /metrics`` returns.

trtllm-serve answers ``/metrics`` with a list of per-iteration objects (camelCase, drained on
read). spectool's server emits the same keys so one client and one parser
(:mod:`spectool.trtllm.iter_stats`) read both servers. Semantics follow TensorRT-LLM's PyTorch
executor:

- ``specDecodingStats.acceptanceLength`` = (accepted + requests with drafts) / requests with
  drafts, the mean tokens a drafting request gained this iteration (0.0 when none drafted);
- ``specDecodingStats.iterLatencyMS`` is the drafter's time, ``draftOverhead`` = draft ms /
  iteration ms;
- no ``specDecodingStats`` key at all when speculation is off (``method="none"``).

KV cache: the engine reserves ``max_seq_len`` positions per batch slot; the stats count
positions, so ``tokensPerBlock`` is 1, ``maxNumBlocks`` is max_batch_size x max_seq_len and
``usedNumBlocks`` the positions holding tokens after the iteration. There is no prefix reuse:
``reusedBlocks`` and ``missedBlocks`` are 0.

``inflightBatchingStats``: ``numContextRequests`` are the requests prefilled in the iteration,
``numGenRequests`` those decoded in it (a new request decodes from the next iteration on, as in
TensorRT-LLM); ``numCtxTokens`` is not counted (0).

``spectoolStats`` adds what TensorRT-LLM does not report: accepted and drafted counts per draft
position, the phase times (ms) and the scheduled draft length.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from spectool.engine.engine import IterationStats

# TensorRT-LLM's PyTorch executor stamps iterations with this local-time format.
TIMESTAMP_FORMAT = "%m-%d-%Y %H:%M:%S.%f"
TOKENS_PER_BLOCK = 1


def format_timestamp(epoch_s: float) -> str:
    """``epoch_s`` (seconds since the epoch) in TensorRT-LLM's iteration-stats format."""
    return datetime.fromtimestamp(epoch_s).strftime(TIMESTAMP_FORMAT)


def iteration_stats_json(stats: IterationStats) -> dict[str, Any]:
    """One iteration as a TensorRT-LLM ``/metrics`` entry (plus ``spectoolStats``)."""
    used_blocks = stats.used_num_tokens // TOKENS_PER_BLOCK
    max_blocks = stats.max_num_tokens // TOKENS_PER_BLOCK
    entry: dict[str, Any] = {
        "timestamp": format_timestamp(stats.timestamp),
        "iter": stats.iter,
        "iterLatencyMS": stats.iter_latency_ms,
        "numActiveRequests": stats.num_active_requests,
        "numQueuedRequests": stats.num_queued_requests,
        "numNewActiveRequests": stats.num_new_active_requests,
        "numCompletedRequests": stats.num_completed_requests,
        "maxNumActiveRequests": stats.max_batch_size,
        "maxBatchSizeStatic": stats.max_batch_size,
        "maxNumTokensStatic": stats.max_num_tokens,
        "kvCacheStats": {
            "maxNumBlocks": max_blocks,
            "freeNumBlocks": max_blocks - used_blocks,
            "usedNumBlocks": used_blocks,
            "tokensPerBlock": TOKENS_PER_BLOCK,
            "allocTotalBlocks": used_blocks,
            "reusedBlocks": 0,
            "missedBlocks": 0,
            "cacheHitRate": 0.0,
        },
        "inflightBatchingStats": {
            "numScheduledRequests": stats.num_active_requests,
            "numContextRequests": stats.num_new_active_requests,
            "numGenRequests": stats.num_decoded_requests,
            "numPausedRequests": 0,
            "numCtxTokens": 0,
            "avgNumDecodedTokensPerIter": 0.0,
            "microBatchId": 0,
        },
    }
    if stats.drafted_per_pos:  # speculation configured (one entry per draft position)
        with_drafts = stats.num_requests_with_draft_tokens
        entry["specDecodingStats"] = {
            "numDraftTokens": stats.num_draft_tokens,
            "numAcceptedTokens": stats.num_accepted_tokens,
            "numRequestsWithDraftTokens": with_drafts,
            "acceptanceLength": (
                (stats.num_accepted_tokens + with_drafts) / with_drafts if with_drafts else 0.0
            ),
            "iterLatencyMS": stats.draft_ms,
            "draftOverhead": (
                stats.draft_ms / stats.iter_latency_ms if stats.iter_latency_ms > 0 else 0.0
            ),
        }
    entry["spectoolStats"] = {
        "acceptedPerPos": list(stats.accepted_per_pos),
        "draftedPerPos": list(stats.drafted_per_pos),
        "draftMS": stats.draft_ms,
        "verifyMS": stats.verify_ms,
        "coordMS": stats.coord_ms,
        "prefillMS": stats.prefill_ms,
        "draftLen": stats.draft_len,
    }
    return entry


# Prometheus text at /prometheus/metrics, where trtllm-serve mounts prometheus_client's app
# (tensorrt_llm/serve/openai_server.py, main 2026: Mount("/prometheus/metrics", ...)); metric
# names from tensorrt_llm/metrics/collector.py (main @050f80d). Counters are totals since the
# server started and never drained, so any number of readers may scrape them.
PROMETHEUS_PATH = "/prometheus/metrics"
_PROMETHEUS: tuple[tuple[str, str, str], ...] = (
    ("trtllm_num_requests_completed_total", "counter", "Total number of completed requests."),
    ("trtllm_prompt_tokens_total", "counter", "Cumulative number of prompt tokens processed."),
    ("trtllm_generation_tokens_total", "counter", "Cumulative number of output tokens produced."),
    ("trtllm_spec_decode_num_draft_tokens_total", "counter", "Total draft tokens proposed."),
    ("trtllm_spec_decode_num_accepted_tokens_total", "counter", "Total draft tokens accepted."),
    ("trtllm_iterations_total", "counter", "Engine iterations (spectool extension)."),
    ("trtllm_num_requests_running", "gauge", "Number of active requests."),
    ("trtllm_num_requests_waiting", "gauge", "Number of queued requests."),
    ("trtllm_iteration_latency_seconds", "gauge", "Latency of the last iteration in seconds."),
    ("trtllm_spec_decode_acceptance_length", "gauge", "Mean acceptance length, last iteration."),
)


class PrometheusTotals:
    """Running totals of the engine's iterations, for :func:`prometheus_text`."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {name: 0.0 for name, _, _ in _PROMETHEUS}

    def add(self, stats: IterationStats) -> None:
        v = self.values
        v["trtllm_num_requests_completed_total"] += stats.num_completed_requests
        v["trtllm_prompt_tokens_total"] += stats.num_prompt_tokens
        v["trtllm_generation_tokens_total"] += (
            stats.num_new_active_requests + stats.num_decoded_requests + stats.num_accepted_tokens
        )
        v["trtllm_spec_decode_num_draft_tokens_total"] += stats.num_draft_tokens
        v["trtllm_spec_decode_num_accepted_tokens_total"] += stats.num_accepted_tokens
        v["trtllm_iterations_total"] += 1
        v["trtllm_num_requests_running"] = stats.num_active_requests
        v["trtllm_num_requests_waiting"] = stats.num_queued_requests
        v["trtllm_iteration_latency_seconds"] = stats.iter_latency_ms / 1000.0
        with_drafts = stats.num_requests_with_draft_tokens
        if with_drafts:
            v["trtllm_spec_decode_acceptance_length"] = (
                stats.num_accepted_tokens + with_drafts
            ) / with_drafts


def prometheus_text(totals: PrometheusTotals, model_name: str) -> str:
    """The totals in Prometheus' text exposition format (version 0.0.4)."""
    label = model_name.replace("\\", "\\\\").replace('"', '\\"')
    lines = []
    for name, kind, help_text in _PROMETHEUS:
        lines += [
            f"# HELP {name} {help_text}",
            f"# TYPE {name} {kind}",
            f'{name}{{model_name="{label}",engine_type="spectool"}} {totals.values[name]!r}',
        ]
    return "\n".join(lines) + "\n"
