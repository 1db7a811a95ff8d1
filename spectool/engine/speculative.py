"""Draft proposers and the verification rule of speculative decoding.

Proposers (:mod:`spectool.engine.proposers`: a draft model, prompt lookup, ...) guess the next k
tokens of each running request. The target then scores all guesses in one forward over k + 1
positions, and :func:`verify_greedy` / :func:`verify_sampled` decide, per request, how many
guesses survive: the same rule whatever proposed them.

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

import torch
from torch import Tensor

from spectool.engine.proposers.ngram import propose_ngram  # noqa: F401 (re-exported)
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


def verify_batch(
    logits: Tensor,  # [B, 1 + kmax, V] of the verify forward
    drafts: Sequence[Sequence[int]],
    q_rows: Sequence[Tensor | None],  # q [k, V] per row with sampled model drafts, else None
    rows: Sequence[RowSampling],
) -> list[Verdict]:
    """Verdicts of a batch: :func:`verify_greedy` for greedy rows (one arg-max over the batch),
    :func:`verify_sampled` on the processed distributions for the others."""
    verdicts: list[Verdict | None] = [None] * len(drafts)
    greedy = [b for b, row in enumerate(rows) if row.greedy]
    sampled = [b for b, row in enumerate(rows) if not row.greedy]
    if greedy:
        greedy_logits = logits if not sampled else logits[greedy]  # no copy when all greedy
        argmax = argmax_tokens(greedy_logits, [rows[b] for b in greedy]).tolist()
        for i, b in enumerate(greedy):
            verdicts[b] = verify_greedy(drafts[b], argmax[i][: 1 + len(drafts[b])])
    if sampled:
        probs = process_logits(logits[sampled], [rows[b] for b in sampled])  # [Bs, T, V]
        for i, b in enumerate(sampled):
            k = len(drafts[b])
            verdicts[b] = verify_sampled(drafts[b], q_rows[b], probs[i, : k + 1], rows[b].generator)
    return [v for v in verdicts if v is not None]
