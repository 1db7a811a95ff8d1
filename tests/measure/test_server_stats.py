"""Pooling polled iteration stats into the numbers the decision math consumes."""

from __future__ import annotations

from typing import Any

import pytest

from spectool.decide.acceptance import PositionCounts
from spectool.decide.cell import IterationSample
from spectool.errors import BadInputError
from spectool.measure.runner import TrialConfig, TrialResult
from spectool.measure.server_stats import iteration_samples, summarize_iterations, to_cell
from spectool.trtllm.iter_stats import parse_iteration_stats

# TensorRT-LLM-shaped /metrics entries (the keys trtllm-serve sends), no spectool extension.
TRTLLM_ENTRIES: list[dict[str, Any]] = [
    {  # a context request joined: prefill mixed into the step time
        "iterLatencyMS": 10.0,
        "numActiveRequests": 2,
        "inflightBatchingStats": {"numContextRequests": 1, "numGenRequests": 1},
        "specDecodingStats": {
            "numDraftTokens": 3,
            "numAcceptedTokens": 2,
            "numRequestsWithDraftTokens": 1,
            "iterLatencyMS": 0.0,
        },
    },
    {
        "iterLatencyMS": 8.0,
        "numActiveRequests": 2,
        "inflightBatchingStats": {"numContextRequests": 0, "numGenRequests": 2},
        "specDecodingStats": {
            "numDraftTokens": 6,
            "numAcceptedTokens": 4,
            "numRequestsWithDraftTokens": 2,
            "iterLatencyMS": 2.0,
        },
    },
    {
        "iterLatencyMS": 6.0,
        "numActiveRequests": 1,
        "inflightBatchingStats": {"numContextRequests": 0, "numGenRequests": 1},
        "specDecodingStats": {
            "numDraftTokens": 3,
            "numAcceptedTokens": 0,
            "numRequestsWithDraftTokens": 1,
            "iterLatencyMS": 1.5,
        },
    },
    {"iterLatencyMS": 5.0, "numActiveRequests": 1, "numNewActiveRequests": 0},  # no drafting
]


def test_trtllm_sums_acceptance_and_batch_buckets() -> None:
    summary = summarize_iterations(parse_iteration_stats(TRTLLM_ENTRIES))
    assert summary.iterations == 4 and summary.spec_iterations == 3
    assert (summary.num_draft_tokens, summary.num_accepted_tokens) == (12, 6)
    assert summary.num_requests_with_draft_tokens == 4
    assert summary.acceptance_rate == 0.5
    assert summary.mean_acceptance_length == (6 + 4) / 4  # pooled, not a mean of ratios
    assert summary.mean_active_requests == 1.5
    assert summary.accepted_per_pos == () and summary.position_counts() is None
    assert summary.draft_ms is None and summary.verify_ms is None  # no spectool extension
    assert summary.iter_latency_ms is not None and summary.iter_latency_ms.max == 10.0
    assert summary.step_ms is not None
    assert summary.step_ms.count == 3 and summary.step_ms.mean == pytest.approx((8 + 6 + 5) / 3)
    assert sorted(summary.by_batch_size) == [1, 2]
    two, one = summary.by_batch_size[2], summary.by_batch_size[1]
    assert (two.iterations, two.num_draft_tokens, two.num_accepted_tokens) == (2, 9, 6)
    assert two.mean_acceptance_length == 3.0
    assert (one.iterations, one.mean_acceptance_length) == (2, 1.0)
    assert two.by_batch_size == {}


def test_trtllm_decode_samples_skip_mixed_iterations() -> None:
    stats = parse_iteration_stats(TRTLLM_ENTRIES)
    assert iteration_samples(stats) == (
        IterationSample(2.0, 6.0, 0.0, 2, 6),  # draft ms from specDecodingStats.iterLatencyMS
        IterationSample(1.5, 4.5, 0.0, 1, 1),
        IterationSample(0.0, 5.0, 0.0, 1, 1),
    )
    mixed = iteration_samples(stats, include_mixed=True)
    assert mixed[0] == IterationSample(0.0, 10.0, 0.0, 1, 3)  # numGenRequests is the batch
    assert len(mixed) == 4


def test_spectool_extension_gives_positions_and_phase_times() -> None:
    def entry(active: int, accepted: list[int], drafted: list[int], prefill: float) -> dict:
        return {
            "iterLatencyMS": 20.0,
            "numActiveRequests": active,
            "spectoolStats": {
                "acceptedPerPos": accepted,
                "draftedPerPos": drafted,
                "draftMS": 3.0,
                "verifyMS": 9.0,
                "coordMS": 1.0,
                "prefillMS": prefill,
                "draftLen": len(drafted),
            },
        }

    stats = parse_iteration_stats(
        [entry(2, [2, 1, 0], [2, 2, 2], 7.0), entry(2, [1, 1, 1], [2, 2, 2], 0.0)]
    )
    summary = summarize_iterations(stats)
    assert summary.accepted_per_pos == (3, 2, 1) and summary.drafted_per_pos == (4, 4, 4)
    assert (summary.num_draft_tokens, summary.num_accepted_tokens) == (12, 6)
    assert summary.position_counts() == PositionCounts((3, 2, 1), (4, 3, 2))
    assert summary.draft_ms is not None and summary.draft_ms.mean == 3.0
    assert summary.prefill_ms is not None and summary.prefill_ms.max == 7.0
    # The step is draft + verify + coordination; the prefill of new requests is left out.
    assert summary.step_ms is not None and summary.step_ms.mean == 13.0
    assert iteration_samples(stats) == (
        IterationSample(3.0, 9.0, 1.0, 2, 5),
        IterationSample(3.0, 9.0, 1.0, 2, 5),
    )


def test_real_trial_counts_add_up(ladder) -> None:
    _, results, _, _ = ladder
    for result in results:
        raw = result.raw_iteration_stats
        summary = summarize_iterations(result.iteration_stats)
        assert summary.iterations == len(raw)
        assert summary.num_draft_tokens == sum(
            e["specDecodingStats"]["numDraftTokens"] for e in raw
        )
        assert summary.num_accepted_tokens == sum(
            e["specDecodingStats"]["numAcceptedTokens"] for e in raw
        )
        assert sum(b.iterations for b in summary.by_batch_size.values()) == len(raw)
        assert set(summary.by_batch_size) == {e["numActiveRequests"] for e in raw}
        assert summary.mean_acceptance_length is not None
        assert 1.0 <= summary.mean_acceptance_length <= 4.0  # k = 3 plus the bonus token
        positions = summary.position_counts()
        assert positions is not None and positions.max_draft_len == 3
        # Server and client agree: the first token of each request comes from its prefill,
        # every later one from a decode step's confirmed tokens.
        samples = iteration_samples(result.iteration_stats)
        output = sum(r.output_tokens for r in result.records)
        assert sum(s.confirmed_tokens for s in samples) + len(result.records) == output


def test_to_cell(ladder) -> None:
    _, results, _, _ = ladder
    c4 = results[1]
    cell = to_cell(c4, 3)
    assert cell.key == (4, 3)
    assert cell.records == c4.records and cell.duration_s == c4.wall_time_s
    assert cell.positions is not None and cell.positions.max_draft_len == 3
    samples = iteration_samples(c4.iteration_stats)
    tokens = cell.tokens_per_step()
    assert tokens == sum(s.confirmed_tokens for s in samples) / sum(s.batch_size for s in samples)
    assert 1.0 <= tokens <= 4.0
    with pytest.raises(BadInputError, match="acceptance counted at 3 positions"):
        to_cell(c4, 2)
    open_loop = TrialResult(
        config=TrialConfig("rate", rate_per_s=1.0),
        records=(),
        token_count_sources=(),
        iteration_stats=(),
        raw_iteration_stats=(),
        wall_time_s=1.0,
        started_at="",
    )
    with pytest.raises(BadInputError, match="open-loop"):
        to_cell(open_loop, 3)
