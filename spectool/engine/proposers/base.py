"""The seam between the engine and the ways of guessing tokens: the :class:`Proposer` protocol.

The engine knows no method by name. For a ``method`` it looks up a :class:`ProposerSpec` in
:data:`spectool.engine.proposers.PROPOSERS`, builds the proposer once with a
:class:`ProposerContext`, and then, per request and step:

1. ``allocate(slot)`` when a request joins while speculation is on (the target's slot number);
2. ``prefill(slots, prompts, hidden)`` after the target's prefill of those prompts;
3. ``propose(slots, contexts, budgets, rows)`` before each verify pass: up to ``budget`` drafts
   per request and, for drafts sampled from a model, q per draft position (so that
   :func:`~spectool.engine.speculative.verify_sampled` is exact);
4. ``commit(slot, num_valid, hidden)`` after verification: the target cache holds ``num_valid``
   valid tokens; the proposer rolls its own state back to match;
5. ``release(slot)`` when the request leaves.

``hidden_layers``: target decoder layers whose outputs the proposer needs (EAGLE-3's auxiliary
hidden states); the engine captures them in its prefill and verify forwards and hands them over
(``hidden`` above, ``[B, T, len(hidden_layers) * dim]`` in prefill, ``[num_accepted + 1, C]``
in commit: the features of the positions verification kept). Empty: ``hidden`` is None.
Verification itself is shared and method-independent (:mod:`spectool.engine.speculative`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from spectool.engine.model import Transformer
from spectool.engine.sampling import RowSampling, argmax_tokens, process_logits, sample
from spectool.engine.tokenizer import Tokenizer


@dataclass(frozen=True)
class ProposerContext:
    """What a proposer factory gets from the engine.

    ``checkpoint``: the drafter folder the engine was given (None for methods without one).
    ``max_seq_len``: the target's sequence limit (a proposer may support fewer: its
    ``max_seq_len``). ``config``: the :class:`~spectool.engine.config.EngineConfig`.
    """

    target: Transformer
    target_path: Path
    tokenizer: Tokenizer
    checkpoint: Path | None
    config: Any
    device: torch.device
    dtype: torch.dtype
    max_batch_size: int
    max_seq_len: int


class Proposer(Protocol):
    """Guesses the next tokens of running requests (see the module docstring for the calls)."""

    max_seq_len: int  # longest sequence it can follow (<= the context's max_seq_len)
    hidden_layers: tuple[int, ...]  # target layers whose outputs it needs (empty: none)

    def allocate(self, slot: int) -> None: ...

    def release(self, slot: int) -> None: ...

    def prefill(
        self, slots: Sequence[int], prompts: Sequence[Sequence[int]], hidden: Tensor | None
    ) -> None: ...

    def propose(
        self,
        slots: Sequence[int],
        contexts: Sequence[Sequence[int]],  # every token of each request so far
        budgets: Sequence[int],  # at most this many drafts per row, >= 1
        rows: Sequence[RowSampling],
    ) -> tuple[list[list[int]], Tensor | None]: ...  # drafts, q [B, kmax, V] or None

    def commit(self, slot: int, num_valid: int, hidden: Tensor | None) -> None: ...


@dataclass(frozen=True)
class ProposerSpec:
    """A registry entry: ``factory`` builds the proposer; ``needs_checkpoint``: whether the
    method runs a drafter checkpoint (the engine's ``drafter_path``), required then and refused
    otherwise."""

    name: str
    factory: Callable[[ProposerContext], Proposer]
    needs_checkpoint: bool


def pick_tokens(
    logits: Tensor,  # [b, 1, V] over the target vocabulary
    step_rows: Sequence[RowSampling],
    all_greedy: bool,
) -> tuple[list[int], Tensor | None]:
    """One draft per row from a model's logits: arg-max for greedy rows, a sample from the
    processed distribution q otherwise. Returns the tokens and q ``[b, V]`` (None when every
    row is greedy: drafts are then verified greedily and need no q)."""
    if all_greedy:
        return argmax_tokens(logits, step_rows)[:, 0].tolist(), None
    q = process_logits(logits, step_rows)[:, 0]  # [b, V]
    picks = [
        int(q[i].argmax()) if row.greedy else sample(q[i], row.generator)
        for i, row in enumerate(step_rows)
    ]
    return picks, q
