"""A Llama / Qwen2 / Qwen3 decoder in plain PyTorch, built from a Hugging Face ``config.json``.

In the spirit of gpt-fast's ``model.py``: one ``ModelArgs``, one ``Transformer``, RMSNorm, SwiGLU,
grouped-query attention and rotary embeddings in Hugging Face's "rotate half" layout, so weights
load without any permutation. Every forward carries per-row positions, which lets one batch mix
requests of different lengths (continuous batching) and lets padding be marked with position -1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spectool.engine.kv_cache import KVCache
from spectool.errors import CheckpointError

# model_type -> the one architecture name Hugging Face writes for it.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling (``rope_scaling`` / ``rope_parameters`` in config.json).

    ``rope_type`` is ``"default"`` (none), ``"linear"`` (all frequencies divided by ``factor``)
    or ``"llama3"`` (Llama 3.1: low frequencies divided by ``factor``, high ones kept, a smooth
    blend between ``low_freq_factor`` and ``high_freq_factor``).
    """

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelArgs:
    """Shape and numerics of a decoder, read from a Hugging Face ``config.json`` dict.

    Invariants: ``n_heads % n_kv_heads == 0``; ``head_dim`` may differ from ``dim // n_heads``
    (Qwen3). ``qkv_bias`` is the q/k/v projection bias (always on for Qwen2), ``o_bias`` the output
    projection bias, ``qk_norm`` the per-head RMSNorm on queries and keys (Qwen3).
    """

    model_type: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False

    @classmethod
    def from_hf_config(
        cls, config: Mapping[str, Any], where: str | Path | None = None
    ) -> ModelArgs:
        """Build from a parsed config.json; unknown architectures raise :class:`CheckpointError`.

        Reads both the transformers 4.x layout (``rope_theta`` + ``rope_scaling``) and the 5.x
        layout (``rope_parameters``).
        """
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_ARCHITECTURES:
            raise CheckpointError(
                where,
                f"unsupported model_type {model_type!r}; the engine runs "
                f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}",
            )
        architectures = config.get("architectures") or [SUPPORTED_ARCHITECTURES[model_type]]
        if list(architectures) != [SUPPORTED_ARCHITECTURES[model_type]]:
            raise CheckpointError(
                where,
                f"unsupported architectures {architectures!r} for model_type {model_type!r}; "
                f"expected [{SUPPORTED_ARCHITECTURES[model_type]!r}]",
            )
        layer_types = config.get("layer_types") or []
        if config.get("use_sliding_window") or "sliding_attention" in layer_types:
            raise CheckpointError(where, "sliding-window attention is not supported by the engine")
        try:
            dim = int(config["hidden_size"])
            n_heads = int(config["num_attention_heads"])
            n_kv_heads = int(config.get("num_key_value_heads") or n_heads)
            head_dim = int(config.get("head_dim") or dim // n_heads)
            args = cls(
                model_type=model_type,
                dim=dim,
                n_layers=int(config["num_hidden_layers"]),
                n_heads=n_heads,
                n_kv_heads=n_kv_heads,
                head_dim=head_dim,
                intermediate_size=int(config["intermediate_size"]),
                vocab_size=int(config["vocab_size"]),
                norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                rope_theta=_rope_theta(config),
                rope_scaling=_rope_scaling(config, where),
                max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
                o_bias=model_type != "qwen2" and bool(config.get("attention_bias", False)),
                mlp_bias=bool(config.get("mlp_bias", False)),
                qk_norm=model_type == "qwen3",
            )
        except KeyError as e:
            raise CheckpointError(where, f"config.json lacks {e.args[0]!r}") from e
        except (TypeError, ValueError) as e:
            raise CheckpointError(where, f"config.json has a malformed field: {e}") from e
        if n_kv_heads <= 0 or n_heads % n_kv_heads:
            raise CheckpointError(
                where, f"num_attention_heads {n_heads} is not a multiple of kv heads {n_kv_heads}"
            )
        if head_dim % 2:
            raise CheckpointError(where, f"head_dim {head_dim} must be even for rotary embeddings")
        return args


def _rope_theta(config: Mapping[str, Any]) -> float:
    params = config.get("rope_parameters") or {}
    return float(params.get("rope_theta", config.get("rope_theta", 10000.0)))


def _rope_scaling(config: Mapping[str, Any], where: str | Path | None) -> RopeScaling:
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise CheckpointError(
            where,
            f"unsupported rope_type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}",
        )
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError(where, "partial_rotary_factor != 1 is not supported")
    if rope_type == "default":
        return RopeScaling()
    return RopeScaling(
        rope_type=rope_type,
        factor=float(params["factor"]),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get(
                "original_max_position_embeddings", config.get("max_position_embeddings", 8192)
            )
        ),
    )


def rope_inv_freq(args: ModelArgs) -> Tensor:
    """Inverse frequencies ``[head_dim // 2]`` (float32), with linear or llama3 scaling applied."""
    dim = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    scaling = args.rope_scaling
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        old_len = scaling.original_max_position_embeddings
        low_freq_wavelen = old_len / scaling.low_freq_factor
        high_freq_wavelen = old_len / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
        smooth = (old_len / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


def rope_tables(args: ModelArgs, max_seq_len: int) -> tuple[Tensor, Tensor]:
    """cos and sin tables ``[max_seq_len, head_dim]`` (float32) in the rotate-half layout."""
    inv_freq = rope_inv_freq(args)
    freqs = torch.arange(max_seq_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)  # [max_seq_len, head_dim]
    return emb.cos(), emb.sin()


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` [B, H, T, D] by ``cos``/``sin`` [B, 1, T, D] (already in x's dtype)."""
    return x * cos + _rotate_half(x) * sin


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 like Hugging Face's ``LlamaRMSNorm``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)`` (w1 = gate_proj, w3 = up_proj, w2 = down_proj)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.intermediate_size, bias=args.mlp_bias)
        self.w3 = nn.Linear(args.dim, args.intermediate_size, bias=args.mlp_bias)
        self.w2 = nn.Linear(args.intermediate_size, args.dim, bias=args.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Attention(nn.Module):
    """Grouped-query attention over the KV cache (or over the current tokens when no cache)."""

    def __init__(self, args: ModelArgs, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.head_dim = args.head_dim
        q_size = args.n_heads * args.head_dim
        kv_size = args.n_kv_heads * args.head_dim
        self.split_sizes = (q_size, kv_size, kv_size)
        self.wqkv = nn.Linear(args.dim, q_size + 2 * kv_size, bias=args.qkv_bias)
        self.wo = nn.Linear(q_size, args.dim, bias=args.o_bias)
        self.q_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None

    def forward(
        self,
        x: Tensor,  # [B, T, dim]
        cos: Tensor,  # [B, 1, T, head_dim]
        sin: Tensor,  # [B, 1, T, head_dim]
        positions: Tensor,  # [B, T] int64, -1 = padding
        mask: Tensor,  # [B, 1, T, L] bool, True = may attend
        cache: KVCache | None,
        slots: Tensor | None,  # [B] int64 cache rows
        kv_len: int,  # L: keys read from the cache
    ) -> Tensor:
        bsz, seqlen, _ = x.shape
        q, k, v = self.wqkv(x).split(self.split_sizes, dim=-1)
        q = q.view(bsz, seqlen, self.n_heads, self.head_dim)  # [B, T, H, D]
        k = k.view(bsz, seqlen, self.n_kv_heads, self.head_dim)  # [B, T, Hkv, D]
        v = v.view(bsz, seqlen, self.n_kv_heads, self.head_dim)  # [B, T, Hkv, D]
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)  # [B, H, T, D]
        k = apply_rope(k.transpose(1, 2), cos, sin)  # [B, Hkv, T, D]
        v = v.transpose(1, 2)  # [B, Hkv, T, D]
        if cache is not None and slots is not None:
            cache.write(self.layer_id, slots, positions, k, v)
            k, v = cache.read(self.layer_id, slots, kv_len)  # [B, Hkv, L, D]
        groups = self.n_heads // self.n_kv_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)  # [B, H, L, D]
            v = v.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, H, T, D]
        y = y.transpose(1, 2).reshape(bsz, seqlen, self.n_heads * self.head_dim)
        return self.wo(y)


class TransformerBlock(nn.Module):
    """Pre-norm block: ``h = x + attn(norm(x)); out = h + ffn(norm(h))``."""

    def __init__(self, args: ModelArgs, layer_id: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args, layer_id)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(
        self,
        x: Tensor,  # [B, T, dim]
        cos: Tensor,
        sin: Tensor,
        positions: Tensor,
        mask: Tensor,
        cache: KVCache | None,
        slots: Tensor | None,
        kv_len: int,
    ) -> Tensor:
        h = x + self.attention(
            self.attention_norm(x), cos, sin, positions, mask, cache, slots, kv_len
        )
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Decoder-only language model: embeddings, blocks, final norm, LM head.

    Call :meth:`setup_rope` (done by :func:`spectool.engine.load.load_model`) before the first
    forward; it fixes the longest sequence the model will see.
    """

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args, i) for i in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.max_seq_len = 0
        self.rope_cos: Tensor | None
        self.rope_sin: Tensor | None
        self.register_buffer("rope_cos", None, persistent=False)  # [max_seq_len, head_dim]
        self.register_buffer("rope_sin", None, persistent=False)

    def setup_rope(self, max_seq_len: int) -> None:
        """Precompute rotary tables for positions ``0 .. max_seq_len - 1`` on the weights' device."""
        cos, sin = rope_tables(self.args, max_seq_len)
        device = self.tok_embeddings.weight.device
        self.rope_cos = cos.to(device)
        self.rope_sin = sin.to(device)
        self.max_seq_len = max_seq_len

    def new_cache(self, max_batch_size: int, max_seq_len: int) -> KVCache:
        """A KV cache shaped for this model, on its device and in its dtype."""
        weight = self.tok_embeddings.weight
        return KVCache(
            n_layers=self.args.n_layers,
            max_batch_size=max_batch_size,
            n_kv_heads=self.args.n_kv_heads,
            max_seq_len=max_seq_len,
            head_dim=self.args.head_dim,
            dtype=weight.dtype,
            device=weight.device,
        )

    def forward(
        self,
        tokens: Tensor,  # [B, T] int64
        positions: Tensor,  # [B, T] int64; -1 marks padding (not written, output is junk)
        cache: KVCache | None = None,
        slots: Tensor | None = None,  # [B] int64: the cache row of each batch row
        select: Tensor | None = None,  # [B, N] int64: only these time steps reach the LM head
    ) -> Tensor:
        """Logits ``[B, T, V]`` (or ``[B, N, V]`` with ``select``).

        With a cache, each row's keys/values are written at its positions, then every query
        attends to cache entries ``0 .. its own position`` of its slot: what a row may see is set
        by positions alone, so entries past a slot's length (rolled-back drafts) are never read
        before being overwritten. Without a cache, tokens attend to earlier tokens of the call.
        """
        if self.rope_cos is None or self.rope_sin is None:
            raise RuntimeError("call setup_rope() before forward()")
        if (cache is None) != (slots is None):
            raise ValueError("pass both cache and slots, or neither")
        max_pos = int(positions.max())
        if max_pos >= self.max_seq_len:
            raise ValueError(f"position {max_pos} beyond max_seq_len {self.max_seq_len}")
        x = self.tok_embeddings(tokens)  # [B, T, dim]
        safe_pos = positions.clamp(min=0)
        cos = self.rope_cos[safe_pos].to(x.dtype).unsqueeze(1)  # [B, 1, T, D]
        sin = self.rope_sin[safe_pos].to(x.dtype).unsqueeze(1)
        if cache is not None:
            kv_len = max_pos + 1
            key_pos = torch.arange(kv_len, device=tokens.device)[None, :]  # [1, L]
            visible = key_pos[:, None, :] <= positions[:, :, None]  # [B, T, L]
        else:
            kv_len = tokens.shape[1]
            key_ok = (positions >= 0)[:, None, :]  # [B, 1, T]
            visible = (positions[:, None, :] <= positions[:, :, None]) & key_ok  # [B, T, T]
        # Padding queries see everything: their output is junk, but never NaN.
        visible = visible | (positions < 0)[:, :, None]
        mask = visible[:, None]  # [B, 1, T, L]
        for layer in self.layers:
            x = layer(x, cos, sin, positions, mask, cache, slots, kv_len)
        if select is not None:
            x = torch.gather(x, 1, select[:, :, None].expand(-1, -1, x.shape[-1]))  # [B, N, dim]
        return self.output(self.norm(x))  # [B, T or N, V]
