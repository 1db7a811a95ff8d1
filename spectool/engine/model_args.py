"""Shape and numerics of a decoder read from a Hugging Face ``config.json``, and its rotary tables.

Split from :mod:`spectool.engine.model` (which re-exports every name here): ``ModelArgs``,
``RopeScaling`` and the rotary-embedding frequency tables (default, linear, llama3 scaling).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

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
