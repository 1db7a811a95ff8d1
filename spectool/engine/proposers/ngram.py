"""Prompt lookup (n-gram) drafting: copy what followed an earlier occurrence of the context's
suffix. Stateless: nothing to prefill, commit or release."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import Tensor

from spectool.engine.proposers.base import ProposerContext, ProposerSpec
from spectool.engine.sampling import RowSampling


def propose_ngram(
    context: Sequence[int], k: int, max_matching: int, min_matching: int = 1
) -> list[int]:
    """Up to ``k`` tokens that followed an earlier occurrence of the context's last n tokens.

    Tries n = ``max_matching`` down to ``min_matching``; for the first n whose suffix occurs
    earlier in the context, takes the earliest such occurrence and returns the (at most ``k``)
    tokens right after it. No match: ``[]``. Pure function: same input, same output.

    Example: context ``[1, 2, 3, 4, 2, 3]``, ``k = 4``, ``max_matching = 3``:
      - the last 3 tokens ``[4, 2, 3]`` occur nowhere earlier;
      - the last 2 tokens ``[2, 3]`` occur at index 1; what follows is ``[4, 2, 3]`` (only three
        tokens remain), so the proposal is ``[4, 2, 3]``.
    """
    total = len(context)
    if k <= 0 or total < 2:
        return []
    tokens = np.asarray(context, dtype=np.int64)
    for n in range(min(max_matching, total - 1), max(min_matching, 1) - 1, -1):
        suffix = tokens[total - n :]
        # Windows starting at 0 .. total - n - 1: every occurrence except the suffix itself.
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: total - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return tokens[start : start + k].tolist()
    return []


class NgramProposer:
    """Deterministic drafts (q = one-hot, so no q is returned) from the request's own text."""

    hidden_layers: tuple[int, ...] = ()

    def __init__(self, max_matching: int, max_seq_len: int) -> None:
        self.max_matching = max_matching
        self.max_seq_len = max_seq_len

    def allocate(self, slot: int) -> None:
        pass

    def release(self, slot: int) -> None:
        pass

    def prefill(
        self, slots: Sequence[int], prompts: Sequence[Sequence[int]], hidden: Tensor | None
    ) -> None:
        pass

    def propose(
        self,
        slots: Sequence[int],
        contexts: Sequence[Sequence[int]],
        budgets: Sequence[int],
        rows: Sequence[RowSampling],
    ) -> tuple[list[list[int]], Tensor | None]:
        drafts = [
            propose_ngram(context, budget, self.max_matching)
            for context, budget in zip(contexts, budgets, strict=True)
        ]
        return drafts, None

    def commit(self, slot: int, num_valid: int, hidden: Tensor | None) -> None:
        pass


def _build(ctx: ProposerContext) -> NgramProposer:
    return NgramProposer(ctx.config.ngram_max_matching, ctx.max_seq_len)


SPEC = ProposerSpec(name="ngram", factory=_build, needs_checkpoint=False)
