"""A DeepSeek-V3 multi-token-prediction (MTP) module, read from the target's own checkpoint.

Layout and computation, as the reference runtimes have them:

- deepseek-ai/DeepSeek-V3 ``README_WEIGHTS.md`` (commit 0b39205a): ``num_nextn_predict_layers``
  in config.json counts the MTP modules; module i is stored as decoder layer
  ``num_hidden_layers + i`` (``model.layers.61`` for the 61-layer model) with ``enorm``,
  ``hnorm``, ``eh_proj``, a decoder layer (``input_layernorm``, ``self_attn``,
  ``post_attention_layernorm``, ``mlp``, structure identical to the main model's) and
  ``shared_head`` (``norm``, ``head``); ``embed_tokens`` and ``shared_head.head`` share the main
  model's embedding and output head (the checkpoint stores copies of them).
- NVIDIA/TensorRT-LLM ``tensorrt_llm/_torch/models/modeling_deepseekv3.py`` (commit 000561df,
  ``DeepseekV3MTP.forward``): ``eh_proj(cat([enorm(embed(token)), hnorm(hidden)]))``, the
  decoder layer, then ``shared_head.norm`` of the residual stream is the module's output; the
  logits are the *main* model's ``lm_head`` over it (``DeepseekV3MTPHead`` holds only the norm,
  so the stored ``embed_tokens`` / ``shared_head.head`` copies are never read). The target
  hidden state it reads is the main model's last layer output after the final norm (the last
  decoder layer's ``next_layer_layernorm`` is ``model.norm``).
- vLLM ``vllm/model_executor/models/deepseek_mtp.py`` (commit 03356f8c,
  ``DeepSeekMultiTokenPredictorLayer``): the same ``[embedding, hidden]`` order into
  ``eh_proj``; it returns the pre-norm residual stream and applies ``shared_head.norm`` and its
  own ``shared_head.head`` in ``compute_logits``, and zeroes the embedding at position 0.
  spectool follows TensorRT-LLM: normed output (what the MTP-Eagle chain feeds back), the
  target's LM head, no position-0 masking.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from spectool.engine.kv_cache import KVCache
from spectool.engine.load import (
    MTP_CONFIG_KEY,
    declared_mtp_layers,
    hf_to_engine_names,
    read_checkpoint_tensors,
)
from spectool.engine.model import (
    ModelArgs,
    Projection,
    RMSNorm,
    TransformerBlock,
    _Step,
    rope_tables,
)
from spectool.errors import CheckpointError

# The module's own tensors besides its decoder layer's (DeepSeek-V3 names, under the prefix).
OWN_TENSORS = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")
# Stored copies of the main model's embedding and LM head: TensorRT-LLM reads neither (the
# target's own are used), vLLM reads only ``shared_head.head``; spectool follows TensorRT-LLM.
SHARED_COPIES = ("embed_tokens.weight", "shared_head.head.weight")


def mtp_layer_prefix(n_layers: int, index: int = 0) -> str:
    """Tensor-name prefix of MTP module ``index`` of a target with ``n_layers`` decoder layers."""
    return f"model.layers.{n_layers + index}."


class MtpModule(nn.Module):
    """``enorm``, ``hnorm``, ``eh_proj``, one decoder layer, ``shared_head.norm``.

    Weights use the engine's layout (projections ``[in, out]``, q/k/v and gate/up fused), so the
    layer runs on the engine's own attention and a one-layer KV cache of its own. The token
    embedding and the LM head are the target's (passed in, not copied).
    """

    def __init__(self, args: ModelArgs, lm_head: Projection) -> None:
        super().__init__()
        self.args = args  # the target's, one layer
        dim = args.dim
        self.enorm = RMSNorm(dim, args.norm_eps)
        self.hnorm = RMSNorm(dim, args.norm_eps)
        self.eh_proj = Projection(2 * dim, dim, bias=False)
        self.block = TransformerBlock(args, layer_id=0)
        self.head_norm = RMSNorm(dim, args.norm_eps)  # shared_head.norm
        self._shared = (lm_head,)  # the target's LM head: in a tuple, so not a submodule
        self.rope_cos_sin: Tensor | None = None  # [max_seq_len, 2, head_dim], set by the loader
        self.max_seq_len = 0
        # the layer in one C call (spectool.engine.native_step.NativeMtp), set by the loader
        self.native: Any = None

    def forward(self, embeds: Tensor, hidden: Tensor, step: _Step) -> Tensor:
        """Normed output ``[N, dim]`` for token-major rows: ``embeds`` ``[N, dim]`` (the next
        token's embedding) and ``hidden`` ``[N, dim]`` (the target's final-normed hidden state,
        or this module's previous output in the chain)."""
        both = torch.cat([self.enorm.forward(embeds), self.hnorm.forward(hidden)], dim=-1)
        x = self.eh_proj.forward(both)  # [N, 2 dim] -> [N, dim]
        return self.head_norm.forward(self.block.forward(x, step))

    def logits(self, out: Tensor, vocab_size: int) -> Tensor:
        """Logits ``[N, V]`` over the target vocabulary: the target's LM head over ``out``."""
        return self._shared[0].forward(out)[:, :vocab_size]

    def new_cache(self, max_batch_size: int, max_seq_len: int) -> KVCache:
        weight = self.eh_proj.weight
        return KVCache(
            n_layers=1,
            max_batch_size=max_batch_size,
            n_kv_heads=self.args.n_kv_heads,
            max_seq_len=max_seq_len,
            head_dim=self.args.head_dim,
            dtype=weight.dtype,
            device=weight.device,
        )


def _layer_names(args: ModelArgs) -> dict[str, str]:
    """HF names of one decoder layer (as ``model.layers.0.*``) -> engine names (``block.*``)."""
    one = replace(args, n_layers=1)
    return {
        hf: "block." + ours[len("layers.0.") :]
        for hf, ours in hf_to_engine_names(one).items()
        if hf.startswith("model.layers.0.")
    }


def mtp_state_dict(folder: Path, args: ModelArgs, index: int = 0) -> dict[str, Tensor]:
    """Engine-named tensors of MTP module ``index`` of the checkpoint in ``folder``
    (q/k/v and gate/up fused, projections ``[in, out]``, file dtype)."""
    prefix = mtp_layer_prefix(args.n_layers, index)
    raw = read_checkpoint_tensors(folder, lambda name: name.startswith(prefix))
    raw = {name[len(prefix) :]: t for name, t in raw.items()}
    if not raw:
        raise CheckpointError(folder, f"holds no tensors {prefix}* (its MTP module)")
    layer = {hf[len("model.layers.0.") :]: ours for hf, ours in _layer_names(args).items()}
    expected = set(layer) | set(OWN_TENSORS)
    missing = sorted(expected - set(raw))
    if missing:
        raise CheckpointError(folder, f"lacks tensor {prefix}{missing[0]} of its MTP module")
    extra = sorted(set(raw) - expected - set(SHARED_COPIES))
    if extra:
        raise CheckpointError(folder, f"has unexpected tensor {prefix}{extra[0]} in its MTP module")
    state: dict[str, Tensor] = {
        "enorm.weight": raw["enorm.weight"],
        "hnorm.weight": raw["hnorm.weight"],
        "eh_proj.weight": raw["eh_proj.weight"].t(),  # [dim, 2 dim] -> [in, out]
        "head_norm.weight": raw["shared_head.norm.weight"],
    }
    fused: dict[str, list[str]] = {}
    for hf, ours in layer.items():
        fused.setdefault(ours, []).append(hf)
    for ours, names in fused.items():
        tensor = torch.cat([raw[n] for n in names]) if len(names) > 1 else raw[names[0]]
        is_matrix = ours.endswith(".weight") and tensor.dim() == 2
        state[ours] = tensor.t() if is_matrix else tensor
    return state


def load_mtp_module(
    folder: Path,
    target_args: ModelArgs,
    lm_head: Projection,
    device: torch.device,
    dtype: torch.dtype,
    max_seq_len: int,
    pack_fp16: bool = False,
) -> MtpModule:
    """The first MTP module of the target checkpoint in ``folder`` (MTP-Eagle re-applies it for
    every draft step); :class:`CheckpointError` when the target declares or holds none."""
    declared = declared_mtp_layers(folder)
    if declared < 1:
        raise CheckpointError(
            folder / "config.json",
            f"declares no MTP layers ({MTP_CONFIG_KEY} absent or 0): method mtp needs a target "
            "with its own MTP module",
        )
    args = replace(target_args, n_layers=1)
    state = mtp_state_dict(folder, target_args)
    with torch.device("meta"):
        module = MtpModule(args, lm_head)
    expected = module.state_dict()
    for name, tensor in state.items():
        if name not in expected:
            raise CheckpointError(folder, f"MTP tensor for {name} has no place in the module")
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(
                folder,
                f"MTP tensor for {name} has shape {list(tensor.shape)}, config.json implies "
                f"{list(expected[name].shape)}",
            )
    state = {k: v.to(device=device, dtype=dtype).contiguous() for k, v in state.items()}
    module.load_state_dict(state, strict=True, assign=True)
    if pack_fp16:
        for sub in module.modules():
            if isinstance(sub, Projection):
                sub.pack_fp16()
    cos, sin = rope_tables(args, max_seq_len)
    half = sin.shape[-1] // 2
    sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
    module.rope_cos_sin = torch.stack([cos, sin_signed], dim=1).to(device)
    module.max_seq_len = max_seq_len
    if pack_fp16:  # float16-exact weights: the layer on the C step where it fits
        from spectool.engine.native_step import bind_mtp_module

        module.native = bind_mtp_module(module)
    return module.eval()
