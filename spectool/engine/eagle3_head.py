"""An EAGLE-3 draft head: one decoder layer over [embedding; fused target features].

Layout and computation follow the published heads and their reference runtimes:

- SafeAILab/EAGLE ``eagle/model/cnets.py`` (commit 148042c5, EAGLE-3 ``Model`` and
  ``LlamaDecoderLayeremb``): ``fc`` (3 x target hidden -> hidden, no bias) fuses the three
  captured target hidden states; ``midlayer`` is one Llama decoder layer whose attention input is
  ``cat(input_layernorm(embedding), hidden_norm(hidden))`` (2 x hidden), with the residual taken
  from the un-normed ``hidden``; ``norm`` then ``lm_head`` (``draft_vocab_size`` rows) give the
  draft logits; buffers ``d2t`` (draft id -> target id offset: ``target = draft + d2t[draft]``)
  and ``t2d`` (bool mask over the target vocabulary). The token embedding is the target's
  (``embed_tokens`` is not stored in the head; fixture ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``).
  The chain feeds the layer's pre-norm output back as the next step's hidden state (``fc`` is
  skipped when the hidden width is already ``hidden``).
- vLLM ``vllm/model_executor/models/llama_eagle3.py`` (commit 00bd1493): the same layer
  (``midlayer.`` loaded as ``layers.0.``, qkv input 2 x hidden), ``compute_logits`` scatters the
  draft logits to ``arange(draft_vocab_size) + d2t`` in a target-vocabulary row of ``-inf``.
- TensorRT-LLM ``tensorrt_llm/_torch/speculative/eagle3.py`` (commit 001e6700,
  ``Eagle3SpecMetadata``): captured layers default to ``(1, L // 2 - 1, L - 4)`` for a target of
  L > 5 layers (given ones are sorted); a capture is the residual stream after the layer
  (``hidden_states + residual``), concatenated in that order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from spectool.ckpt.jsonfile import read_json_object
from spectool.engine.kv_cache import KVCache
from spectool.engine.model import (
    Attention,
    FeedForward,
    ModelArgs,
    Projection,
    RMSNorm,
    _Step,
    rope_tables,
)
from spectool.errors import CheckpointError

ARCHITECTURE = "LlamaForCausalLMEagle3"
WEIGHTS_FILE = "model.safetensors"


def default_capture_layers(n_layers: int) -> tuple[int, ...]:
    """TensorRT-LLM's default EAGLE-3 capture for a target of ``n_layers`` decoder layers."""
    if n_layers <= 5:
        raise ValueError(f"a target of {n_layers} layers is too shallow for the default capture")
    return (1, n_layers // 2 - 1, n_layers - 4)


class Eagle3Head(nn.Module):
    """``fc`` + one decoder layer (``midlayer``) + ``norm`` + ``lm_head`` + ``d2t``/``t2d``.

    Weights use the engine's layout (projections ``[in, out]``, q/k/v and gate/up fused), so the
    head runs on the engine's own :class:`Attention` and KV cache.
    """

    def __init__(self, args: ModelArgs, n_capture: int, draft_vocab_size: int) -> None:
        super().__init__()
        self.args = args
        dim = args.dim
        self.n_capture = n_capture
        self.draft_vocab_size = draft_vocab_size
        self.fc = Projection(n_capture * dim, dim, bias=False)
        self.hidden_norm = RMSNorm(dim, args.norm_eps)
        self.input_layernorm = RMSNorm(dim, args.norm_eps)
        self.attention = Attention(args, layer_id=0)
        q_size = args.n_heads * args.head_dim
        kv_size = args.n_kv_heads * args.head_dim
        # The attention reads [embedding; hidden]: twice the width of the rest of the layer.
        self.attention.wqkv = Projection(2 * dim, q_size + 2 * kv_size, bias=args.qkv_bias)
        self.post_attention_layernorm = RMSNorm(dim, args.norm_eps)
        self.feed_forward = FeedForward(args)
        self.norm = RMSNorm(dim, args.norm_eps)
        self.lm_head = Projection(dim, draft_vocab_size, bias=False)
        self.d2t: Tensor
        self.t2d: Tensor
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(args.vocab_size, dtype=torch.bool))
        # Target id of every draft id (arange + d2t), set by :meth:`set_vocab_map`.
        self.draft_to_target: Tensor
        self.register_buffer("draft_to_target", torch.arange(draft_vocab_size), persistent=False)
        self.rope_cos_sin: Tensor | None = None  # [max_seq_len, 2, head_dim], set by the loader
        self.max_seq_len = 0
        # the layer in one C call (spectool.engine.native_step.NativeHead), set by the loader
        self.native: Any = None

    def set_vocab_map(self, d2t: Tensor, t2d: Tensor) -> None:
        """Install ``d2t`` (draft id -> target id offset) and ``t2d`` (target-id mask)."""
        self.d2t = d2t.to(self.d2t.device, torch.long)
        self.t2d = t2d.to(self.t2d.device, torch.bool)
        self.draft_to_target = torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def forward(self, embeds: Tensor, hidden: Tensor, step: _Step) -> Tensor:
        """Pre-norm output ``[N, dim]`` of the layer for token-major rows: ``embeds`` ``[N, dim]``
        (the next token's target embedding), ``hidden`` ``[N, n_capture * dim]`` (target
        features, fused by ``fc``) or ``[N, dim]`` (the head's own previous output)."""
        if hidden.shape[-1] != self.args.dim:
            hidden = self.fc.forward(hidden)
        both = torch.cat(
            [self.input_layernorm.forward(embeds), self.hidden_norm.forward(hidden)], dim=-1
        )
        h = hidden + self.attention.forward(both, step)
        return h + self.feed_forward.forward(self.post_attention_layernorm.forward(h))

    def logits(self, out: Tensor, vocab_size: int) -> Tensor:
        """Logits over the target vocabulary ``[N, V]`` from layer outputs ``[N, dim]``: the
        draft vocabulary's at their target ids, ``-inf`` elsewhere (vLLM's compute_logits)."""
        draft = self.lm_head.forward(self.norm.forward(out))  # [N, Vd]
        full = draft.new_full((draft.shape[0], vocab_size), float("-inf"))
        full[:, self.draft_to_target] = draft
        return full

    def new_cache(self, max_batch_size: int, max_seq_len: int) -> KVCache:
        weight = self.lm_head.weight
        return KVCache(
            n_layers=1,
            max_batch_size=max_batch_size,
            n_kv_heads=self.args.n_kv_heads,
            max_seq_len=max_seq_len,
            head_dim=self.args.head_dim,
            dtype=weight.dtype,
            device=weight.device,
        )


def head_config(folder: Path, target: ModelArgs) -> tuple[ModelArgs, tuple[int, ...], int]:
    """The head's :class:`ModelArgs`, the target layers it reads, and its draft vocabulary size,
    from ``folder/config.json``; :class:`CheckpointError` for a head this target cannot run."""
    path = folder / "config.json"
    config: dict[str, Any] = dict(read_json_object(path))
    as_llama = {**config, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    args = ModelArgs.from_hf_config(as_llama, where=path)
    if args.n_layers != 1:
        raise CheckpointError(path, f"an EAGLE-3 head has 1 decoder layer, not {args.n_layers}")
    if args.dim != target.dim or int(config.get("target_hidden_size", target.dim)) != target.dim:
        raise CheckpointError(path, f"hidden_size {args.dim} != the target's {target.dim}")
    if args.vocab_size != target.vocab_size:
        raise CheckpointError(
            path, f"vocab_size {args.vocab_size} != the target's {target.vocab_size}"
        )
    draft_vocab = int(config.get("draft_vocab_size") or args.vocab_size)
    if not 0 < draft_vocab <= args.vocab_size:
        raise CheckpointError(path, f"draft_vocab_size {draft_vocab} outside 1..{args.vocab_size}")
    eagle = config.get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    if ids is None:
        try:
            layers = default_capture_layers(target.n_layers)
        except ValueError as e:
            raise CheckpointError(
                path, f"{e}; set eagle_config.eagle_aux_hidden_state_layer_ids"
            ) from None
    else:
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise CheckpointError(path, "eagle_aux_hidden_state_layer_ids must be a list of ints")
        layers = tuple(sorted(ids))
        if len(set(layers)) != len(layers) or not all(0 <= i < target.n_layers for i in layers):
            raise CheckpointError(
                path,
                f"eagle_aux_hidden_state_layer_ids {ids} must be distinct layers of the "
                f"target's 0..{target.n_layers - 1}",
            )
    return args, layers, draft_vocab


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as e:
        raise CheckpointError(path, f"not a readable safetensors file: {e}") from e


def load_eagle3_head(
    folder: Path,
    target: ModelArgs,
    device: torch.device,
    dtype: torch.dtype,
    max_seq_len: int,
    pack_fp16: bool = False,
) -> tuple[Eagle3Head, tuple[int, ...]]:
    """Read an EAGLE-3 head folder (config.json + model.safetensors) for ``target``; returns the
    head (rotary tables for ``max_seq_len``, the engine's: the head's own
    ``max_position_embeddings`` is not a limit, as in TensorRT-LLM) and the target layers it
    reads. ``pack_fp16``: float16-exact projections use fbgemm's kernel, as the target's do."""
    args, layers, draft_vocab = head_config(folder, target)
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        raise CheckpointError(folder, f"has no {WEIGHTS_FILE}")
    raw = _read_safetensors(path)
    head = Eagle3Head(args, len(layers), draft_vocab)
    attn, mlp = "midlayer.self_attn.", "midlayer.mlp."
    fused = {
        "attention.wqkv.weight": [
            attn + "q_proj.weight",
            attn + "k_proj.weight",
            attn + "v_proj.weight",
        ],
        "attention.wo.weight": [attn + "o_proj.weight"],
        "feed_forward.w13.weight": [mlp + "gate_proj.weight", mlp + "up_proj.weight"],
        "feed_forward.w2.weight": [mlp + "down_proj.weight"],
        "fc.weight": ["fc.weight"],
        "lm_head.weight": ["lm_head.weight"],
    }
    plain = {
        "hidden_norm.weight": "midlayer.hidden_norm.weight",
        "input_layernorm.weight": "midlayer.input_layernorm.weight",
        "post_attention_layernorm.weight": "midlayer.post_attention_layernorm.weight",
        "norm.weight": "norm.weight",
    }
    expected = {n for names in fused.values() for n in names} | set(plain.values()) | {"d2t"}
    optional = {"t2d"}
    missing = sorted(expected - set(raw))
    if missing:
        raise CheckpointError(path, f"lacks tensor {missing[0]!r} of an EAGLE-3 head")
    extra = sorted(set(raw) - expected - optional)
    if extra:
        raise CheckpointError(path, f"has unexpected tensor {extra[0]!r} for an EAGLE-3 head")
    state: dict[str, Tensor] = {}
    for ours, names in fused.items():
        state[ours] = torch.cat([raw[n] for n in names], dim=0).t().contiguous()  # [in, out]
    for ours, name in plain.items():
        state[ours] = raw[name]
    params = dict(head.named_parameters())
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(params[name].shape):
            raise CheckpointError(
                path,
                f"tensor for {name} has shape {list(tensor.shape)}, expected "
                f"{list(params[name].shape)}",
            )
    head.load_state_dict(state, strict=False)
    d2t = raw["d2t"]
    if tuple(d2t.shape) != (draft_vocab,) or d2t.dtype != torch.int64:
        raise CheckpointError(path, f"d2t must be int64 [{draft_vocab}]")
    target_ids = torch.arange(draft_vocab) + d2t
    if (target_ids < 0).any() or (target_ids >= args.vocab_size).any():
        raise CheckpointError(path, "d2t maps a draft id outside the target vocabulary")
    if len(set(target_ids.tolist())) != draft_vocab:
        raise CheckpointError(path, "d2t maps two draft ids to one target id")
    t2d = raw.get("t2d")
    if t2d is None:  # optional (TensorRT-LLM's loader does not read it): rebuilt from d2t
        t2d = torch.zeros(args.vocab_size, dtype=torch.bool)
        t2d[target_ids] = True
    elif tuple(t2d.shape) != (args.vocab_size,) or t2d.dtype != torch.bool:
        raise CheckpointError(path, f"t2d must be bool [{args.vocab_size}]")
    head = head.to(device=device, dtype=dtype)
    head.set_vocab_map(d2t.to(device), t2d.to(device))
    if pack_fp16:
        for module in head.modules():
            if isinstance(module, Projection):
                module.pack_fp16()
    cos, sin = rope_tables(args, max_seq_len)
    half = sin.shape[-1] // 2
    sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
    head.rope_cos_sin = torch.stack([cos, sin_signed], dim=1).to(device)
    head.max_seq_len = max_seq_len
    if pack_fp16:  # float16-exact weights: the layer on the C step where it fits
        from spectool.engine.native_step import bind_eagle3_head

        head.native = bind_eagle3_head(head)
    return head.eval(), layers
