"""Engine iteration stats -> TensorRT-LLM ``/metrics`` JSON, and back through the parser."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime

import pytest

from spectool.engine.engine import IterationStats
from spectool.server.metrics import TIMESTAMP_FORMAT, iteration_stats_json
from spectool.trtllm.iter_stats import parse_iteration_stats_json

STATS = IterationStats(
    timestamp=1_700_000_000.25,
    iter=41,
    iter_latency_ms=8.0,
    num_active_requests=3,
    num_queued_requests=2,
    num_new_active_requests=1,
    num_completed_requests=1,
    max_batch_size=4,
    max_num_tokens=4 * 512,
    used_num_tokens=300,
    prefill_ms=1.5,
    draft_ms=2.0,
    verify_ms=4.0,
    coord_ms=0.5,
    draft_len=3,
    num_draft_tokens=9,
    num_accepted_tokens=5,
    num_requests_with_draft_tokens=3,
    accepted_per_pos=(3, 2, 0),
    drafted_per_pos=(3, 3, 3),
)


def test_trtllm_keys_and_semantics() -> None:
    entry = iteration_stats_json(STATS)
    assert datetime.strptime(entry["timestamp"], TIMESTAMP_FORMAT).timestamp() == pytest.approx(
        STATS.timestamp
    )
    assert entry["iter"] == 41 and entry["iterLatencyMS"] == 8.0
    assert (entry["numActiveRequests"], entry["numQueuedRequests"]) == (3, 2)
    assert (entry["numNewActiveRequests"], entry["numCompletedRequests"]) == (1, 1)
    assert entry["maxNumActiveRequests"] == entry["maxBatchSizeStatic"] == 4
    assert entry["maxNumTokensStatic"] == 2048
    kv = entry["kvCacheStats"]
    assert (kv["maxNumBlocks"], kv["usedNumBlocks"], kv["freeNumBlocks"]) == (2048, 300, 1748)
    assert kv["tokensPerBlock"] == 1 and kv["reusedBlocks"] == 0
    spec = entry["specDecodingStats"]
    assert (spec["numDraftTokens"], spec["numAcceptedTokens"]) == (9, 5)
    assert spec["numRequestsWithDraftTokens"] == 3
    assert spec["acceptanceLength"] == pytest.approx((5 + 3) / 3)
    assert spec["iterLatencyMS"] == 2.0  # the draft time, as TensorRT-LLM reports it
    assert spec["draftOverhead"] == pytest.approx(2.0 / 8.0)
    own = entry["spectoolStats"]
    assert own == {
        "acceptedPerPos": [3, 2, 0],
        "draftedPerPos": [3, 3, 3],
        "draftMS": 2.0,
        "verifyMS": 4.0,
        "coordMS": 0.5,
        "prefillMS": 1.5,
        "draftLen": 3,
    }


def test_no_drafts_this_iteration_gives_zero_acceptance_length() -> None:
    quiet = replace(
        STATS,
        num_draft_tokens=0,
        num_accepted_tokens=0,
        num_requests_with_draft_tokens=0,
        accepted_per_pos=(0, 0, 0),
        drafted_per_pos=(0, 0, 0),
    )
    assert iteration_stats_json(quiet)["specDecodingStats"]["acceptanceLength"] == 0.0


def test_speculation_off_has_no_spec_decoding_stats() -> None:
    plain = replace(
        STATS,
        draft_len=0,
        num_draft_tokens=0,
        num_accepted_tokens=0,
        num_requests_with_draft_tokens=0,
        accepted_per_pos=(),
        drafted_per_pos=(),
    )
    entry = iteration_stats_json(plain)
    assert "specDecodingStats" not in entry
    assert entry["spectoolStats"]["draftedPerPos"] == []


def test_round_trips_through_the_trtllm_parser() -> None:
    body = json.dumps([iteration_stats_json(STATS), iteration_stats_json(replace(STATS, iter=42))])
    first, second = parse_iteration_stats_json(body)
    assert (first.iter, second.iter) == (41, 42)
    assert first.iter_latency_ms == 8.0 and first.num_active_requests == 3
    assert first.num_queued_requests == 2 and first.max_num_active_requests == 4
    assert first.kv_cache is not None and first.kv_cache.used_num_blocks == 300
    spec = first.spec_decoding
    assert spec is not None
    assert (spec.num_draft_tokens, spec.num_accepted_tokens) == (9, 5)
    assert spec.acceptance_rate == pytest.approx(5 / 9)
    assert spec.draft_latency_ms == 2.0 and spec.draft_overhead == pytest.approx(0.25)
    own = first.spectool
    assert own is not None
    assert own.accepted_per_pos == (3, 2, 0) and own.drafted_per_pos == (3, 3, 3)
    assert (own.draft_ms, own.verify_ms, own.coord_ms, own.prefill_ms) == (2.0, 4.0, 0.5, 1.5)
    assert own.draft_len == 3
