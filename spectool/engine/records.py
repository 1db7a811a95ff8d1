"""Per-request and per-iteration records of the engine: events, stats, bookkeeping."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from spectool.engine.sampling import RowSampling, SamplingParams


@dataclass(frozen=True)
class TokenEvent:
    """New tokens of one request from one :meth:`Engine.step` (at most one event per request).

    ``finish_reason``: ``"stop"`` (an end-of-sequence or stop id, included in ``token_ids``),
    ``"length"`` (``max_tokens`` or ``max_seq_len`` reached) or ``"abort"``; None while running.
    ``spec``: on a speculating engine's last event of a request, its speculation in vLLM's
    per-request ``speculative_decoding`` shape (what AIPerf reads; :meth:`_Request.spec_stats`).
    """

    request_id: int
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    spec: dict[str, object] | None = None


@dataclass(frozen=True)
class IterationStats:
    """One engine iteration, shaped after TensorRT-LLM's iteration stats (snake_case).

    Times in milliseconds: ``prefill_ms`` (admission + prefill of new requests), ``draft_ms``
    (proposer), ``verify_ms`` (the target forward), ``coord_ms`` (acceptance + bookkeeping);
    ``iter_latency_ms`` covers the whole step. ``num_active_requests``: requests in the batch
    this iteration; ``num_queued_requests``: still waiting after admission. ``max_num_tokens``:
    target KV-cache capacity in tokens (max_batch_size x max_seq_len); ``used_num_tokens``:
    tokens held in it after the iteration. ``draft_len``: scheduled k for this batch size;
    ``accepted_per_pos[i]`` / ``drafted_per_pos[i]``: requests whose draft at position i was
    accepted / proposed (length = max_draft_len, or the draft length set by
    :meth:`Engine.set_draft_len`; empty for ``method="none"``). ``num_decoded_requests``: requests
    in this iteration's decode step (the new ones, prefilled in it, decode from the next one);
    ``num_prompt_tokens``: prompt tokens prefilled in it.
    """

    timestamp: float
    iter: int
    iter_latency_ms: float
    num_active_requests: int
    num_queued_requests: int
    num_new_active_requests: int
    num_completed_requests: int
    max_batch_size: int
    max_num_tokens: int
    used_num_tokens: int
    prefill_ms: float
    draft_ms: float
    verify_ms: float
    coord_ms: float
    draft_len: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_requests_with_draft_tokens: int
    accepted_per_pos: tuple[int, ...]
    drafted_per_pos: tuple[int, ...]
    num_decoded_requests: int = 0
    num_prompt_tokens: int = 0


PREFILL_PADDING_SLACK = 1.25  # a prefill group computes at most 25% padding


def prefill_groups(lengths: Sequence[int]) -> list[list[int]]:
    """Indices of prompts grouped for prefill: by ascending length, a group closes before the
    prompt that would make its padded size (count x longest) exceed
    :data:`PREFILL_PADDING_SLACK` times its real size. Short prompts of similar length still
    share one forward (a few rows make a slow matrix product on a CPU); a long one does not
    make every short one pay its length."""
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        longest = lengths[i]
        if current and (len(current) + 1) * longest > PREFILL_PADDING_SLACK * (total + longest):
            groups.append(current)
            current, total = [], 0
        current.append(i)
        total += longest
    if current:
        groups.append(current)
    return groups


@dataclass
class _Request:
    """Mutable state of one request inside the engine (owned by the stepping thread)."""

    request_id: int
    params: SamplingParams
    generator: torch.Generator | None
    stop_ids: frozenset[int]
    tokens: list[int]  # prompt + output; the last one is not yet in the target cache
    prompt_len: int
    slot: int = -1
    proposer_slot: bool = False  # the proposer holds state for it (speculation was on)
    accepted_per_step: list[int] = field(default_factory=list)  # steps that drafted
    drafted: int = 0

    def spec_stats(self, max_draft_len: int) -> dict[str, object]:
        """This request's speculation as vLLM reports it per request (``metrics.
        speculative_decoding``, vllm-project/vllm#48915, read by AIPerf 0.13): steps that
        drafted, drafts proposed and accepted, and a histogram of accepted drafts per step
        (index j: steps that accepted exactly j, ``max_draft_len + 1`` buckets)."""
        steps = len(self.accepted_per_step)
        accepted = sum(self.accepted_per_step)
        histogram = [0] * (max_draft_len + 1)
        for j in self.accepted_per_step:
            histogram[j] += 1
        return {
            "num_spec_steps": steps,
            "num_draft_tokens": self.drafted,
            "num_accepted_draft_tokens": accepted,
            "num_spec_tokens": max_draft_len,
            "acceptance_histogram": histogram,
            "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": accepted / self.drafted if self.drafted else 0.0,
        }

    def row_sampling(self) -> RowSampling:
        """How this request's next token is processed (``min_tokens`` suppresses stop ids)."""
        left = self.params.min_tokens - self.num_output
        return RowSampling(
            params=self.params,
            generator=self.generator,
            suppress_ids=tuple(sorted(self.stop_ids)) if left > 0 else (),
            suppress_before=max(left, 0),
        )

    def append(self, new_tokens: Sequence[int], emit: _Emit, max_seq_len: int) -> None:
        """Add tokens, stopping at a stop id, ``max_tokens`` or ``max_seq_len``."""
        for token in new_tokens:
            self.tokens.append(int(token))
            emit.tokens.append(int(token))
            if token in self.stop_ids and self.num_output > self.params.min_tokens:
                emit.finish_reason = "stop"
            elif self.num_output >= self.params.max_tokens:
                emit.finish_reason = "length"
            elif len(self.tokens) >= max_seq_len:
                emit.finish_reason = "length"
            if emit.finish_reason is not None:
                return

    def draft_budget(self, draft_len: int, max_seq_len: int) -> int:
        """Drafts worth proposing this step: at most ``draft_len``, and no more than the
        request can still emit besides the verify step's own token."""
        left = min(self.params.max_tokens - self.num_output - 1, max_seq_len - len(self.tokens))
        return max(0, min(draft_len, left))

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.prompt_len


@dataclass
class _Emit:
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class _DecodeCounts:
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    coord_ms: float = 0.0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_requests_with_draft_tokens: int = 0

    def record(
        self,
        request: _Request,
        k: int,
        accepted: int,
        accepted_per_pos: list[int],
        drafted_per_pos: list[int],
    ) -> None:
        """Count one request's verified step (``k`` drafts, ``accepted`` of them kept)."""
        if not k:
            return
        request.accepted_per_step.append(accepted)
        request.drafted += k
        self.num_requests_with_draft_tokens += 1
        self.num_draft_tokens += k
        self.num_accepted_tokens += accepted
        for pos in range(k):
            drafted_per_pos[pos] += 1
        for pos in range(accepted):
            accepted_per_pos[pos] += 1
