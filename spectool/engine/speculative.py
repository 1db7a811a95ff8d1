"""Draft proposers and the verification rule of speculative decoding.

Proposers guess the next k tokens of each running request: :class:`DraftModelProposer` runs a
small model of its own (own KV cache, rolled back like the target's), :func:`propose_ngram` copies
what followed an earlier occurrence of the context's suffix (prompt lookup). The target then scores
all guesses in one forward over k + 1 positions, and :func:`verify_greedy` / :func:`verify_sampled`
decide, per request, how many guesses survive.

Terms (vLLM's rejection sampler): *accepted* drafts are kept as they are; on the first rejection a
*recovered* token is drawn from ``norm(max(0, p - q))``; when all k are accepted a *bonus* token is
drawn from the target's last distribution. Either way one target-sampled token follows the
accepted drafts, so every step emits ``num_accepted + 1`` tokens.

Exactness (Leviathan et al. 2023; Chen et al. 2023): accepting draft ``d ~ q`` with probability
``min(1, p(d) / q(d))`` and otherwise drawing from the normalized residual yields tokens
distributed exactly as ``p``. Deterministic drafts (n-gram, greedy) are the case ``q = one-hot``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from spectool.engine.kv_cache import KVCache
from spectool.engine.model import Transformer, pack_rows
from spectool.engine.sampling import RowSampling, argmax_tokens, process_logits, sample


@dataclass(frozen=True)
class Verdict:
    """What verification kept for one request this step.

    ``token_ids`` = the ``num_accepted`` accepted drafts, then one recovered (after a rejection)
    or bonus (after full acceptance) token; ``bonus`` tells which.
    """

    num_accepted: int
    token_ids: tuple[int, ...]
    bonus: bool


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


def verify_greedy(draft: Sequence[int], target_argmax: Sequence[int]) -> Verdict:
    """Greedy acceptance: keep drafts while they equal the target's arg-max.

    ``target_argmax`` has ``len(draft) + 1`` entries (one per verified position plus the bonus
    position); the token after the accepted prefix is the target's arg-max there.
    """
    accepted = 0
    while accepted < len(draft) and draft[accepted] == target_argmax[accepted]:
        accepted += 1
    return Verdict(
        num_accepted=accepted,
        token_ids=(*draft[:accepted], int(target_argmax[accepted])),
        bonus=accepted == len(draft),
    )


def verify_sampled(
    draft: Sequence[int],
    draft_probs: Tensor | None,  # [k, V] q of each draft position; None = deterministic drafts
    target_probs: Tensor,  # [k + 1, V] p, already processed like q
    generator: torch.Generator | None,
) -> Verdict:
    """Exact speculative sampling for one request (chain of ``k = len(draft)`` drafts).

    Draws ``k`` uniforms ``u_i`` (always ``k``, so a seeded request consumes its generator the same
    way whatever is accepted), accepts draft i while ``u_i * q_i(d_i) < p_i(d_i)``, then draws the
    recovered token from ``max(0, p_m - q_m)`` or the bonus token from ``p_k``.
    """
    k = len(draft)
    device = target_probs.device
    accepted = 0
    if k:
        steps = torch.arange(k, device=device)
        ids = torch.tensor(list(draft), device=device)
        p_draft = target_probs[steps, ids]  # [k]
        q_draft = draft_probs[steps, ids] if draft_probs is not None else torch.ones_like(p_draft)
        uniform = torch.rand(k, generator=generator, device=device, dtype=target_probs.dtype)
        keep = (uniform * q_draft < p_draft).tolist()
        while accepted < k and keep[accepted]:
            accepted += 1
    if accepted == k:
        token = sample(target_probs[k], generator)
        return Verdict(num_accepted=k, token_ids=(*draft, token), bonus=True)
    p = target_probs[accepted]
    if draft_probs is not None:
        q = draft_probs[accepted]
    else:
        q = torch.zeros_like(p)
        q[draft[accepted]] = 1.0
    residual = (p - q).clamp(min=0.0)
    if not float(residual.sum()) > 0.0:  # p == q up to rounding: a rejection is a measure-0 event
        residual = p
    token = sample(residual, generator)
    return Verdict(num_accepted=accepted, token_ids=(*draft[:accepted], token), bonus=False)


class DraftModelProposer:
    """Chain drafting with a standalone small model that keeps its own KV cache.

    The drafter's slot for a request is the target's slot (both caches have the same batch size).
    Its cache may lag behind the context (after a full acceptance, or steps without drafting);
    the first draft forward of a step feeds the missing tokens together with the last one.
    """

    def __init__(self, model: Transformer, cache: KVCache, target_vocab_size: int) -> None:
        self.model = model
        self.cache = cache
        self.target_vocab_size = target_vocab_size
        self._device = model.tok_embeddings.weight.device

    def _to_target_vocab(self, logits: Tensor) -> Tensor:
        """Drafter logits ``[B, T, Vd]`` -> ``[B, T, V]``: extra ids cut, missing ids at -inf."""
        vocab = self.target_vocab_size
        if logits.shape[-1] >= vocab:
            return logits[..., :vocab]
        pad = logits.new_full((*logits.shape[:-1], vocab - logits.shape[-1]), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def prefill(self, slots: Sequence[int], prompts: Sequence[Sequence[int]]) -> None:
        """Write the prompts of newly admitted requests into the drafter's cache."""
        self._forward_tails(slots, prompts, [0] * len(slots))
        for slot, prompt in zip(slots, prompts, strict=True):
            self.cache.set_length(slot, len(prompt))

    def _forward_tails(
        self, slots: Sequence[int], contexts: Sequence[Sequence[int]], starts: Sequence[int]
    ) -> Tensor:
        """Feed ``context[start:]`` of each row; logits ``[B, 1, Vd]`` at each row's last token."""
        tails = [ctx[start:] for ctx, start in zip(contexts, starts, strict=True)]
        tokens, positions = pack_rows(tails, starts)
        select = None  # one token per row (the usual case): its logits are all there are
        if any(len(t) != 1 for t in tails):
            select = torch.tensor([[len(t) - 1] for t in tails], dtype=torch.long)
            select = select.to(self._device)
        return self.model(
            tokens.to(self._device),
            positions.to(self._device),
            self.cache,
            torch.tensor(list(slots), dtype=torch.long, device=self._device),
            select,
        )

    def propose(
        self,
        slots: Sequence[int],
        contexts: Sequence[Sequence[int]],  # every token of each request so far
        num_drafts: Sequence[int],  # k per row, >= 1
        rows: Sequence[RowSampling],
    ) -> tuple[list[list[int]], Tensor | None]:
        """Draft ``num_drafts[b]`` tokens per row; returns drafts and q ``[B, kmax, V]``.

        q is None when every row is greedy (drafts are then arg-maxes, verified greedily).
        Afterwards the drafter's cache holds each context plus all drafts but the last.
        """
        bsz = len(slots)
        kmax = max(num_drafts)
        all_greedy = all(r.greedy for r in rows)
        drafts: list[list[int]] = [[] for _ in range(bsz)]
        q_all = (
            None
            if all_greedy
            else torch.zeros(
                bsz, kmax, self.target_vocab_size, device=self._device, dtype=torch.float32
            )
        )
        active = list(range(bsz))
        active_slots: Tensor | None = None  # rebuilt only when rows drop out
        # Suppression windows move with the step; rows without one need no shifted copy.
        shifting = any(r.suppress_ids and r.suppress_before > 0 for r in rows)
        for step in range(kmax):
            if step == 0:
                starts = [self.cache.lengths[slots[b]] for b in active]
                logits = self._forward_tails(slots, contexts, starts)
            else:
                if active_slots is None:
                    active_slots = torch.tensor(
                        [slots[b] for b in active], dtype=torch.long, device=self._device
                    )
                tokens = torch.tensor([[drafts[b][-1]] for b in active], dtype=torch.long)
                positions = torch.tensor(
                    [[len(contexts[b]) + step - 1] for b in active], dtype=torch.long
                )
                logits = self.model(
                    tokens.to(self._device), positions.to(self._device), self.cache, active_slots
                )
            logits = self._to_target_vocab(logits[:, -1:])  # [b, 1, V]
            step_rows = [rows[b].shifted(step) if shifting else rows[b] for b in active]
            if all_greedy:
                picks = argmax_tokens(logits, step_rows)[:, 0].tolist()
            else:
                q = process_logits(logits, step_rows)[:, 0]  # [b, V]
                picks = []
                for i, b in enumerate(active):
                    q_all[b, step] = q[i]  # type: ignore[index]
                    picks.append(
                        int(q[i].argmax()) if rows[b].greedy else sample(q[i], rows[b].generator)
                    )
            for b, token in zip(active, picks, strict=True):
                drafts[b].append(int(token))
            still = [b for b in active if num_drafts[b] > step + 1]
            if len(still) != len(active):
                active, active_slots = still, None
            if not active:
                break
        for b in range(bsz):
            # Written: the context, then drafts 1 .. k-1 (the last draft was never fed).
            self.cache.set_length(slots[b], len(contexts[b]) + num_drafts[b] - 1)
        return drafts, q_all

    def commit(self, slot: int, num_valid: int) -> None:
        """After verification: keep at most ``num_valid`` entries (the target's valid length)."""
        self.cache.rollback(slot, min(self.cache.lengths[slot], num_valid))
