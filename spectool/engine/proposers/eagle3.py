"""EAGLE-3 drafting: a one-layer head over the target's own hidden states (chain of k drafts).

Head position i holds the pair (target features at position i, embedding of token i + 1) and
predicts token i + 2: the features of the target's layers (:mod:`spectool.engine.eagle3_head`
names them) at the last verified token, with that token's successor, give the first draft. The
chain then feeds the head's own output back (SafeAILab/EAGLE ``cnets.py`` ``topK_genrate``, vLLM
``llama_eagle3.py``): draft j + 1 comes from (head output at draft j's position, draft j).

State per slot: the head's KV cache, valid for ``done[slot]`` positions computed from TARGET
features, and ``pending[slot]``, target features not yet fed (positions ``done ..``). Invariant
between steps: ``done + len(pending)`` = the target cache's length. After verification
(:meth:`Eagle3Proposer.commit`) the chain's positions, computed from the head's own features,
are dropped (cache rolled back to ``done``) and the verify pass's features of the kept
positions join ``pending``: the next proposal re-feeds them with the target's features, as
EAGLE-3 does. Sampled rows get q over the target vocabulary (0 outside the draft vocabulary), so
:func:`~spectool.engine.speculative.verify_sampled` stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from spectool.engine.eagle3_head import Eagle3Head, load_eagle3_head
from spectool.engine.model import Transformer, make_step, pack_rows
from spectool.engine.proposers.base import ProposerContext, ProposerSpec, pick_tokens
from spectool.engine.sampling import RowSampling


class Eagle3Proposer:
    """Chain drafting with an :class:`~spectool.engine.eagle3_head.Eagle3Head`."""

    def __init__(
        self,
        head: Eagle3Head,
        target: Transformer,
        hidden_layers: tuple[int, ...],
        max_batch_size: int,
        max_seq_len: int,
    ) -> None:
        self.model = head
        self.hidden_layers = hidden_layers
        self.max_seq_len = max_seq_len
        self.cache = head.new_cache(max_batch_size, max_seq_len)
        self.vocab_size = target.args.vocab_size
        self._target = target  # the head reads the target's embeddings (Transformer.embed)
        self._embed = target.tok_embeddings.weight
        self._device = self._embed.device
        self.done: dict[int, int] = {}
        self.pending: dict[int, list[Tensor]] = {}

    # -- slots -------------------------------------------------------------------------------

    def allocate(self, slot: int) -> None:
        self.cache.allocate(slot)
        self.done[slot] = 0
        self.pending[slot] = []

    def release(self, slot: int) -> None:
        self.cache.free(slot)
        self.done.pop(slot, None)
        self.pending.pop(slot, None)

    # -- head forwards -----------------------------------------------------------------------

    def _run(
        self,
        slots: Sequence[int],
        tokens: Tensor,  # [B, T] next tokens (padding anything)
        positions: Tensor,  # [B, T], -1 = padding
        hidden: Tensor,  # [B, T, C] features (C = captured width, or dim for chain steps)
    ) -> Tensor:
        """Head layer outputs ``[B, T, dim]``, writing each row's keys/values into its slot."""
        head = self.model
        assert head.rope_cos_sin is not None
        slot_ids = torch.tensor(list(slots), dtype=torch.long, device=self._device)
        positions = positions.to(self._device)
        bsz, seqlen = positions.shape
        embeds = self._target.embed(tokens.to(self._device).reshape(-1))
        feats = hidden.reshape(bsz * seqlen, -1)
        if head.native is not None:
            out = head.native.forward(embeds, feats, positions, slot_ids, self.cache)
        else:
            step = make_step(
                head.args, head.rope_cos_sin, positions, self.cache, slot_ids, self._embed
            )
            out = head.forward(embeds, feats, step)
        return out.view(bsz, seqlen, -1)

    def _feed(
        self, slots: Sequence[int], token_rows: Sequence[Sequence[int]], feats: Sequence[Tensor]
    ) -> Tensor:
        """Feed target features ``feats[b]`` ``[n_b, C]`` paired with ``token_rows[b]`` at the
        slots' next positions (``done``); returns the output at each row's last pair
        ``[B, dim]`` and advances ``done``."""
        starts = [self.done[s] for s in slots]
        tokens, positions = pack_rows(token_rows, starts)
        width = tokens.shape[1]
        hidden = torch.zeros(
            len(slots), width, feats[0].shape[-1], dtype=feats[0].dtype, device=self._device
        )
        for b, f in enumerate(feats):
            hidden[b, : f.shape[0]] = f
        out = self._run(slots, tokens, positions, hidden)
        last = torch.tensor([len(r) - 1 for r in token_rows], device=self._device)
        for slot, row in zip(slots, token_rows, strict=True):
            self.done[slot] += len(row)
            self.cache.set_length(slot, self.done[slot])
        return out[torch.arange(len(slots), device=self._device), last]

    # -- the protocol ------------------------------------------------------------------------

    def prefill(
        self, slots: Sequence[int], prompts: Sequence[Sequence[int]], hidden: Tensor | None
    ) -> None:
        """Feed each prompt's pairs (features i, token i + 1) for i < n - 1; the last position's
        features wait for the token the target is about to sample."""
        assert hidden is not None, "the engine captures the head's layers in prefill"
        fed: list[int] = []
        for b, (slot, prompt) in enumerate(zip(slots, prompts, strict=True)):
            n = len(prompt)
            self.pending[slot] = [hidden[b, n - 1 : n].clone()]  # not a view of the whole batch
            if n > 1:
                fed.append(b)
        if fed:
            self._feed(
                [slots[b] for b in fed],
                [prompts[b][1:] for b in fed],
                [hidden[b, : len(prompts[b]) - 1] for b in fed],
            )

    def propose(
        self,
        slots: Sequence[int],
        contexts: Sequence[Sequence[int]],
        budgets: Sequence[int],
        rows: Sequence[RowSampling],
    ) -> tuple[list[list[int]], Tensor | None]:
        """Draft ``budgets[b]`` tokens per row; q ``[B, kmax, V]`` unless every row is greedy."""
        bsz = len(slots)
        kmax = max(budgets)
        all_greedy = all(r.greedy for r in rows)
        q_all = (
            None
            if all_greedy
            else torch.zeros(bsz, kmax, self.vocab_size, device=self._device, dtype=torch.float32)
        )
        # First step: the pending target features, each with the token that followed it.
        token_rows, feats = [], []
        for slot, ctx in zip(slots, contexts, strict=True):
            pending = self.pending[slot]
            feats.append(pending[0] if len(pending) == 1 else torch.cat(pending))
            n = feats[-1].shape[0]
            token_rows.append(ctx[len(ctx) - n :])
            self.pending[slot] = []
        out = self._feed(slots, token_rows, feats)  # [B, dim]
        drafts: list[list[int]] = [[] for _ in range(bsz)]
        active = list(range(bsz))
        shifting = any(r.suppress_ids and r.suppress_before > 0 for r in rows)
        for step in range(kmax):
            logits = self.model.logits(out, self.vocab_size)[:, None]  # [b, 1, V]
            step_rows = [rows[b].shifted(step) if shifting else rows[b] for b in active]
            picks, q = pick_tokens(logits, step_rows, all_greedy)
            if q is not None and q_all is not None:
                q_all[active, step] = q
            for b, token in zip(active, picks, strict=True):
                drafts[b].append(int(token))
            still = [i for i, b in enumerate(active) if budgets[b] > step + 1]
            if not still:
                break
            out = out[still] if len(still) != len(active) else out
            active = [active[i] for i in still]
            # Chain step: (head output, its draft) at the draft's position; kept until commit.
            tokens = torch.tensor([[drafts[b][-1]] for b in active], dtype=torch.long)
            positions = torch.tensor(
                [[len(contexts[b]) - 1 + step] for b in active], dtype=torch.long
            )
            out = self._run([slots[b] for b in active], tokens, positions, out[:, None])[:, 0]
        return drafts, q_all

    def commit(self, slot: int, num_valid: int, hidden: Tensor | None) -> None:
        """Drop the chain's positions; queue the verify pass's features of the kept ones."""
        assert hidden is not None, "the engine captures the head's layers in verify passes"
        self.cache.rollback(slot, self.done[slot])
        self.pending[slot].append(hidden.clone())  # [num_accepted + 1, C], not a view
        queued = sum(p.shape[0] for p in self.pending[slot])
        if self.done[slot] + queued != num_valid:
            raise RuntimeError(
                f"EAGLE-3 state of slot {slot} out of step: {self.done[slot]} fed + {queued} "
                f"queued != {num_valid} verified"
            )


def _build(ctx: ProposerContext) -> Eagle3Proposer:
    assert ctx.checkpoint is not None  # the registry entry needs one; the engine checks
    head, layers = load_eagle3_head(
        ctx.checkpoint,
        ctx.target.args,
        ctx.device,
        ctx.dtype,
        ctx.max_seq_len,
        pack_fp16=ctx.config.pack_fp16_weights,
    )
    return Eagle3Proposer(head, ctx.target, layers, ctx.max_batch_size, ctx.max_seq_len)


SPEC = ProposerSpec(name="eagle3", factory=_build, needs_checkpoint=True)
