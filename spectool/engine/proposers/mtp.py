"""MTP drafting: the target's own multi-token-prediction module, re-applied for k > 1.

The module (:mod:`spectool.engine.mtp_module`, DeepSeek-V3's layout) reads the target's
final-normed hidden state at position i with the embedding of token i + 1 and predicts token
i + 2. For k > 1 spectool re-applies the same (first) module to its own output, which is
TensorRT-LLM's MTP-Eagle path (``MTPEagleWorker.forward`` in
``tensorrt_llm/_torch/speculative/mtp.py``, NVIDIA/TensorRT-LLM commit 000a01de: ``mtp_layers[0]``
for every draft step, the next step reading the previous step's output and draft at the
next position), the default for a checkpoint with one MTP module. TensorRT-LLM's vanilla MTP
(one module per step, ``use_mtp_vanilla``) is not implemented: a checkpoint with several
modules drafts with its first.

That chain is EAGLE's, so the bookkeeping is :class:`Eagle3Proposer`'s (KV of the module per
slot, fed from the target's features of verified positions; the chain's own positions rolled
back after verification, as MTP-Eagle's ``kv_lens`` does): only the features differ. EAGLE-3
fuses three captured layers with ``fc``; MTP reads the target's last layer after its final norm,
so the engine captures the last decoder layer and this proposer applies the target's ``norm``.
Drafts are sampled from the module's distribution (q over the target vocabulary), so
verification stays exact for sampled requests (TensorRT-LLM's MTP samples greedily only).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from spectool.engine.model import Transformer
from spectool.engine.mtp_module import MtpModule, load_mtp_module
from spectool.engine.proposers.base import ProposerContext, ProposerSpec
from spectool.engine.proposers.eagle3 import Eagle3Proposer


class MtpProposer(Eagle3Proposer):
    """Chain drafting with the target's :class:`~spectool.engine.mtp_module.MtpModule`."""

    def __init__(
        self, module: MtpModule, target: Transformer, max_batch_size: int, max_seq_len: int
    ) -> None:
        last = target.args.n_layers - 1
        super().__init__(module, target, (last,), max_batch_size, max_seq_len)  # type: ignore[arg-type]
        self._final_norm = target.norm

    def _features(self, hidden: Tensor | None) -> Tensor:
        """The target's last-layer outputs -> its final-normed hidden states (same shape)."""
        assert hidden is not None, "the engine captures the target's last layer"
        return self._final_norm.forward(hidden)

    def prefill(
        self, slots: Sequence[int], prompts: Sequence[Sequence[int]], hidden: Tensor | None
    ) -> None:
        super().prefill(slots, prompts, self._features(hidden))

    def commit(self, slot: int, num_valid: int, hidden: Tensor | None) -> None:
        super().commit(slot, num_valid, self._features(hidden))


def _build(ctx: ProposerContext) -> MtpProposer:
    module = load_mtp_module(
        ctx.target_path,
        ctx.target.args,
        ctx.target.output,
        ctx.device,
        ctx.dtype,
        ctx.max_seq_len,
        pack_fp16=ctx.config.pack_fp16_weights,
    )
    return MtpProposer(module, ctx.target, ctx.max_batch_size, ctx.max_seq_len)


SPEC = ProposerSpec(name="mtp", factory=_build, needs_checkpoint=False)
