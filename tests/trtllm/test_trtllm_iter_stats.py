"""/metrics iteration stats parsing.

The sample follows the C++ ``IterationStats`` of
``cpp/include/tensorrt_llm/executor/types.h`` (NVIDIA/TensorRT-LLM) serialized with camelCase
keys, as ``trtllm-serve``'s ``GET /metrics`` returns it; its ``specDecodingStats`` is consistent
(acceptanceLength = (13 accepted + 8 requests) / 8 requests = 2.625).
"""

from __future__ import annotations

import copy
import json

import pytest

from spectool.errors import BadInputError
from spectool.trtllm.iter_stats import parse_iteration_stats, parse_iteration_stats_json

SAMPLE = [
    {
        "timestamp": "11-29-2025 14:55:01",
        "iter": 1041,
        "iterLatencyMS": 18.73,
        "newActiveRequestsQueueLatencyMS": 0.0,
        "numNewActiveRequests": 0,
        "numActiveRequests": 8,
        "numQueuedRequests": 0,
        "numCompletedRequests": 1,
        "maxNumActiveRequests": 64,
        "maxBatchSizeStatic": 64,
        "maxBatchSizeTunerRecommended": 0,
        "maxBatchSizeRuntime": 64,
        "maxNumTokensStatic": 8192,
        "maxNumTokensTunerRecommended": 0,
        "maxNumTokensRuntime": 8192,
        "gpuMemUsage": 74543251456,
        "cpuMemUsage": 0,
        "pinnedMemUsage": 0,
        "kvCacheStats": {
            "maxNumBlocks": 4210,
            "freeNumBlocks": 3876,
            "usedNumBlocks": 334,
            "tokensPerBlock": 32,
            "allocTotalBlocks": 340,
            "allocNewBlocks": 6,
            "reusedBlocks": 12,
            "missedBlocks": 328,
            "cacheHitRate": 0.0353,
        },
        "inflightBatchingStats": {
            "numScheduledRequests": 8,
            "numContextRequests": 0,
            "numGenRequests": 8,
            "numPausedRequests": 0,
            "numCtxTokens": 0,
            "microBatchId": 0,
            "avgNumDecodedTokensPerIter": 2.625,
        },
        "specDecodingStats": {
            "numDraftTokens": 32,
            "numAcceptedTokens": 13,
            "numRequestsWithDraftTokens": 8,
            "acceptanceLength": 2.625,
            "iterLatencyMS": 0.0,
            "draftOverhead": 0.0,
        },
    },
    {  # a prefill iteration of a server without speculation, older key set
        "iter": 1042,
        "iterLatencyMS": 41,
        "numActiveRequests": 1,
        "numQueuedRequests": 3,
        "kvCacheStats": None,
    },
]


def test_real_shaped_sample():
    first, second = parse_iteration_stats_json(json.dumps(SAMPLE))
    assert first.iter == 1041 and first.timestamp == "11-29-2025 14:55:01"
    assert first.iter_latency_ms == pytest.approx(18.73)
    assert (first.num_active_requests, first.num_queued_requests) == (8, 0)
    assert first.gpu_mem_usage_bytes == 74543251456
    assert first.kv_cache.used_num_blocks == 334 and first.kv_cache.tokens_per_block == 32
    assert first.kv_cache.cache_hit_rate == pytest.approx(0.0353)
    assert first.inflight_batching.num_gen_requests == 8
    spec = first.spec_decoding
    assert (spec.num_draft_tokens, spec.num_accepted_tokens) == (32, 13)
    assert spec.num_requests_with_draft_tokens == 8
    assert spec.acceptance_rate == pytest.approx(13 / 32)
    assert spec.acceptance_length == pytest.approx((13 + 8) / 8)
    assert spec.draft_latency_ms == 0.0 and first.spectool is None
    # tolerant of missing optional keys; ints accepted where floats are expected
    assert second.iter_latency_ms == 41.0 and isinstance(second.iter_latency_ms, float)
    assert second.kv_cache is None and second.spec_decoding is None
    assert second.timestamp is None and second.gpu_mem_usage_bytes is None


def test_spectool_extension():
    entry = copy.deepcopy(SAMPLE[0])
    entry["spectoolStats"] = {
        "acceptedPerPos": [7, 4, 2, 0],
        "draftedPerPos": [8, 8, 8, 8],
        "draftMS": 2.5,
        "verifyMS": 14.0,
        "coordMS": 0.8,
        "prefillMS": 0,
        "draftLen": 4,
    }
    own = parse_iteration_stats([entry])[0].spectool
    assert own.accepted_per_pos == (7, 4, 2, 0) and own.drafted_per_pos == (8, 8, 8, 8)
    assert (own.draft_ms, own.verify_ms, own.coord_ms, own.prefill_ms) == (2.5, 14.0, 0.8, 0.0)
    assert own.draft_len == 4


def _broken(mutate):
    entry = copy.deepcopy(SAMPLE[0])
    mutate(entry)
    with pytest.raises(BadInputError) as info:
        parse_iteration_stats([SAMPLE[1], entry], where="http://127.0.0.1:8000/metrics")
    assert str(info.value).startswith("http://127.0.0.1:8000/metrics: [1]")
    return str(info.value)


def test_wrong_types_name_the_key_path():
    msg = _broken(lambda e: e["specDecodingStats"].update(numDraftTokens="32"))
    assert "[1].specDecodingStats.numDraftTokens: expected an integer" in msg
    msg = _broken(lambda e: e.update(numActiveRequests=8.0))
    assert "[1].numActiveRequests" in msg
    msg = _broken(lambda e: e.update(iterLatencyMS=True))
    assert "[1].iterLatencyMS: expected a number" in msg
    msg = _broken(lambda e: e.update(kvCacheStats=[1, 2]))
    assert "[1].kvCacheStats: expected an object" in msg
    msg = _broken(lambda e: e["inflightBatchingStats"].update(numGenRequests=-1))
    assert "must be >= 0" in msg
    msg = _broken(lambda e: e.update(timestamp=12))
    assert "[1].timestamp: expected a string" in msg


def test_required_and_inconsistent_values():
    assert "[1].iterLatencyMS: missing" in _broken(lambda e: e.pop("iterLatencyMS"))
    msg = _broken(lambda e: e["specDecodingStats"].pop("numAcceptedTokens"))
    assert "specDecodingStats.numAcceptedTokens: missing" in msg
    msg = _broken(lambda e: e["specDecodingStats"].update(numAcceptedTokens=40))
    assert "numAcceptedTokens 40 > numDraftTokens 32" in msg
    msg = _broken(lambda e: e.update(spectoolStats={"acceptedPerPos": [1], "draftedPerPos": []}))
    assert "acceptedPerPos has 1 positions" in msg
    msg = _broken(lambda e: e.update(spectoolStats={"acceptedPerPos": [3], "draftedPerPos": [2]}))
    assert "acceptedPerPos[0]: 3 > drafted 2" in msg
    msg = _broken(lambda e: e.update(spectoolStats={"draftedPerPos": [1, "x"]}))
    assert "draftedPerPos[1]" in msg


def test_payload_shape():
    assert parse_iteration_stats([]) == []
    with pytest.raises(BadInputError, match="expected a JSON list"):
        parse_iteration_stats({"iterLatencyMS": 1})
    with pytest.raises(BadInputError, match="not valid JSON"):
        parse_iteration_stats_json("[{")
    with pytest.raises(BadInputError, match=r"\[0\]: expected an object"):
        parse_iteration_stats([3])
