"""Draft-model drafting: a standalone small causal LM with its own KV cache (chain drafting)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from spectool.engine.kv_cache import KVCache
from spectool.engine.load import load_model
from spectool.engine.model import Transformer, pack_rows
from spectool.engine.proposers.base import ProposerContext, ProposerSpec, pick_tokens
from spectool.engine.sampling import RowSampling
from spectool.engine.tokenizer import Tokenizer
from spectool.errors import CheckpointError


class DraftModelProposer:
    """Chain drafting with a standalone small model that keeps its own KV cache.

    The drafter's slot for a request is the target's slot (both caches have the same batch size).
    Its cache may lag behind the context (after a full acceptance, or steps without drafting);
    the first draft forward of a step feeds the missing tokens together with the last one.
    """

    hidden_layers: tuple[int, ...] = ()

    def __init__(self, model: Transformer, cache: KVCache, target_vocab_size: int) -> None:
        self.model = model
        self.cache = cache
        self.target_vocab_size = target_vocab_size
        self.max_seq_len = cache.max_seq_len
        self._device = model.tok_embeddings.weight.device

    def allocate(self, slot: int) -> None:
        self.cache.allocate(slot)  # the same slot in both caches

    def release(self, slot: int) -> None:
        self.cache.free(slot)

    def _to_target_vocab(self, logits: Tensor) -> Tensor:
        """Drafter logits ``[B, T, Vd]`` -> ``[B, T, V]``: extra ids cut, missing ids at -inf."""
        vocab = self.target_vocab_size
        if logits.shape[-1] >= vocab:
            return logits[..., :vocab]
        pad = logits.new_full((*logits.shape[:-1], vocab - logits.shape[-1]), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def prefill(
        self, slots: Sequence[int], prompts: Sequence[Sequence[int]], hidden: Tensor | None
    ) -> None:
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
        budgets: Sequence[int],  # k per row, >= 1
        rows: Sequence[RowSampling],
    ) -> tuple[list[list[int]], Tensor | None]:
        """Draft ``budgets[b]`` tokens per row; returns drafts and q ``[B, kmax, V]``.

        q is None when every row is greedy (drafts are then arg-maxes, verified greedily).
        Afterwards the drafter's cache holds each context plus all drafts but the last.
        """
        bsz = len(slots)
        kmax = max(budgets)
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
            picks, q = pick_tokens(logits, step_rows, all_greedy)
            if q is not None and q_all is not None:
                q_all[active, step] = q
            for b, token in zip(active, picks, strict=True):
                drafts[b].append(int(token))
            still = [b for b in active if budgets[b] > step + 1]
            if len(still) != len(active):
                active, active_slots = still, None
            if not active:
                break
        for b in range(bsz):
            # Written: the context, then drafts 1 .. k-1 (the last draft was never fed).
            self.cache.set_length(slots[b], len(contexts[b]) + budgets[b] - 1)
        return drafts, q_all

    def commit(self, slot: int, num_valid: int, hidden: Tensor | None = None) -> None:
        """After verification: keep at most ``num_valid`` entries (the target's valid length)."""
        self.cache.rollback(slot, min(self.cache.lengths[slot], num_valid))


def check_same_vocab(tokenizer: Tokenizer, target_path: Path, drafter_path: Path) -> None:
    """Refuse a drafter whose tokenizer maps tokens to different ids than the target's."""
    if not (drafter_path / "tokenizer.json").is_file():
        return
    drafter_tokenizer = Tokenizer.from_dir(drafter_path)
    if drafter_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise CheckpointError(drafter_path, f"tokenizer differs from the target's ({target_path})")


def _build(ctx: ProposerContext) -> DraftModelProposer:
    assert ctx.checkpoint is not None  # the registry entry needs one; the engine checks
    drafter = load_model(
        ctx.checkpoint,
        device=ctx.device,
        dtype=ctx.dtype,
        max_seq_len=ctx.max_seq_len,
        pack_fp16=ctx.config.pack_fp16_weights,
    )
    check_same_vocab(ctx.tokenizer, ctx.target_path, ctx.checkpoint)
    max_seq_len = min(ctx.max_seq_len, drafter.max_seq_len)
    cache = drafter.new_cache(ctx.max_batch_size, max_seq_len)
    return DraftModelProposer(drafter, cache, ctx.target.args.vocab_size)


SPEC = ProposerSpec(name="draft_model", factory=_build, needs_checkpoint=True)
