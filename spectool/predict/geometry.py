"""What the step-cost model needs to know about one model: sizes, never weights.

A :class:`Geometry` comes from checkpoint headers (:func:`geometry_from_checkpoint`, reading a
:class:`~spectool.ckpt.inspect.Checkpoint`'s config and tensor table) or from a plain mapping a
profile can carry for offline use (:func:`geometry_from_mapping`, validated by
:class:`GeometrySpec`; missing or impossible fields are errors, never defaults).

Parameter classes, per token of a forward pass:

* ``dense_params``: read by every token: attention, dense MLPs, shared experts, norms and the LM
  head (``lm_head_params`` of them). The input embedding is a row lookup and is left out.
* ``expert_params``: one routed expert of one MoE layer; ``moe_layers`` layers hold
  ``num_experts`` of them, each token routed to ``experts_per_token``.
* ``kv_bytes_per_token``: KV-cache bytes one token of context occupies over all layers.

For memory per rank (:mod:`spectool.memory_ranks`, offline from a profile) three more facts:
``embedding_params`` (the model's own input embedding table; 0 when it has none of its own: tied
to the LM head, or a draft head that uses the target's), ``num_kv_heads`` (how the KV cache
splits over TP) and ``kv_latent`` (multi-head latent attention: one latent per token and layer,
never split); and ``mtp_layers``, the MTP modules the checkpoint ships.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from spectool.errors import BadInputError

if TYPE_CHECKING:
    from spectool.ckpt.inspect import Checkpoint

# Bytes per element of a weight or KV dtype, by torch/HF spelling and short name.
DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "fp32": 4,
    "float16": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8_e4m3fn": 1,
    "fp8": 1,
    "int8": 1,
    "nvfp4": 0.5625,  # 4-bit values + one fp8 scale per 16
    "fp4": 0.5,
    "int4": 0.5,
}

_EXPERT_RE = re.compile(r"(?:^|\.)experts\.(\d+)\.")
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_EMBED_NAMES = ("embed_tokens.weight", "tok_embeddings.weight", "wte.weight")


@dataclass(frozen=True)
class Geometry:
    """Sizes of one model (or draft head) for the step-cost model; see the module docstring."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    head_dim: int
    dense_params: float
    lm_head_params: float
    kv_bytes_per_token: float
    weight_bytes_per_param: float
    expert_params: float = 0.0
    num_experts: int = 0
    experts_per_token: int = 0
    moe_layers: int = 0
    embedding_params: float | None = None  # None: not known (per-rank memory needs it)
    num_kv_heads: int | None = None
    kv_latent: bool = False
    mtp_layers: int = 0  # the checkpoint's MTP modules (num_nextn_predict_layers)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and self.moe_layers > 0

    @property
    def active_params(self) -> float:
        """Parameters one token multiplies by (dense + its top-k experts per MoE layer)."""
        return self.dense_params + self.moe_layers * self.experts_per_token * self.expert_params

    @property
    def total_params(self) -> float:
        return self.dense_params + self.moe_layers * self.num_experts * self.expert_params

    def distinct_experts(self, tokens: float) -> float:
        """Expected distinct experts of one MoE layer touched by ``tokens`` top-k routed tokens:
        ``E * (1 - (1 - k/E) ** tokens)`` (uniform routing, the upper end of real traffic)."""
        if not self.is_moe:
            return 0.0
        e, k = self.num_experts, self.experts_per_token
        return e * (1.0 - (1.0 - k / e) ** tokens)

    def with_layers(self, num_layers: int, name: str | None = None) -> Geometry:
        """The same model cut to ``num_layers`` decoder layers (MTP: one layer per draft step)."""
        per_layer = (self.dense_params - self.lm_head_params) / self.num_layers
        kv_per_layer = self.kv_bytes_per_token / self.num_layers
        return replace(
            self,
            name=name or self.name,
            num_layers=num_layers,
            dense_params=per_layer * num_layers + self.lm_head_params,
            kv_bytes_per_token=kv_per_layer * num_layers,
            moe_layers=min(self.moe_layers, num_layers),
        )


class GeometrySpec(BaseModel):
    """The geometry block a profile (or a published-results table) can carry, for offline use.

    Params are counts (floats allowed: ``8.03e9``). ``dense_params`` excludes the input
    embedding and includes ``lm_head_params``. Either ``kv_bytes_per_token`` or the attention
    shape (``num_kv_heads``, plus ``kv_dtype``) must be given; MoE fields go together.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_layers: int = Field(ge=1, le=100_000)
    hidden_size: int = Field(ge=1, le=1 << 20)
    num_attention_heads: int = Field(ge=1, le=1 << 16)
    head_dim: int = Field(ge=1, le=1 << 16)
    dense_params: float = Field(gt=0)
    lm_head_params: float = Field(ge=0)
    weight_dtype: str
    num_kv_heads: int | None = Field(default=None, ge=1)
    kv_dtype: str | None = None
    kv_bytes_per_token: float | None = Field(default=None, gt=0)
    expert_params: float = Field(default=0, ge=0)
    num_experts: int = Field(default=0, ge=0)
    experts_per_token: int = Field(default=0, ge=0)
    moe_layers: int = Field(default=0, ge=0)
    embedding_params: float | None = Field(default=None, ge=0)
    kv_latent: bool = False
    mtp_layers: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> GeometrySpec:
        if self.weight_dtype not in DTYPE_BYTES:
            raise ValueError(
                f"weight_dtype {self.weight_dtype!r} unknown ({', '.join(DTYPE_BYTES)})"
            )
        if self.kv_dtype is not None and self.kv_dtype not in DTYPE_BYTES:
            raise ValueError(f"kv_dtype {self.kv_dtype!r} unknown")
        if self.kv_bytes_per_token is None and self.num_kv_heads is None:
            raise ValueError("give kv_bytes_per_token or num_kv_heads")
        if self.lm_head_params > self.dense_params:
            raise ValueError("lm_head_params exceeds dense_params")
        moe = (self.num_experts, self.experts_per_token, self.moe_layers, self.expert_params)
        if any(moe) and not all(moe):
            raise ValueError(
                "MoE needs num_experts, experts_per_token, moe_layers and expert_params together"
            )
        if self.experts_per_token > self.num_experts:
            raise ValueError("experts_per_token exceeds num_experts")
        if self.moe_layers > self.num_layers:
            raise ValueError("moe_layers exceeds num_layers")
        return self


def geometry_from_mapping(data: Mapping[str, Any], name: str, where: str | None = None) -> Geometry:
    """A :class:`Geometry` from a plain mapping (a profile's ``geometry:`` block).

    Raises :class:`~spectool.errors.BadInputError` naming ``where`` and every bad field.
    """
    try:
        spec = GeometrySpec.model_validate(dict(data))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'geometry'}: {e['msg']}" for e in exc.errors()
        )
        raise BadInputError(where or name, f"invalid geometry: {problems}") from exc
    kv = spec.kv_bytes_per_token
    if kv is None:
        kv_elem = DTYPE_BYTES[spec.kv_dtype or spec.weight_dtype]
        kv = 2 * spec.num_layers * (spec.num_kv_heads or 0) * spec.head_dim * kv_elem
    return Geometry(
        name=name,
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        head_dim=spec.head_dim,
        dense_params=spec.dense_params,
        lm_head_params=spec.lm_head_params,
        kv_bytes_per_token=kv,
        weight_bytes_per_param=DTYPE_BYTES[spec.weight_dtype],
        expert_params=spec.expert_params,
        num_experts=spec.num_experts,
        experts_per_token=spec.experts_per_token,
        moe_layers=spec.moe_layers,
        embedding_params=spec.embedding_params,
        num_kv_heads=spec.num_kv_heads,
        kv_latent=spec.kv_latent,
        mtp_layers=spec.mtp_layers,
    )


def _config_int(config: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def geometry_from_checkpoint(ckpt: Checkpoint, kv_dtype: str | None = None) -> Geometry:
    """A :class:`Geometry` from a checkpoint's config and tensor table (headers only).

    Tensors of layers at or beyond ``num_hidden_layers`` (DeepSeek's MTP layers) and ``mtp.*``
    tensors are left out: they are not part of a target forward. Routed experts are recognised
    by ``experts.<n>.`` in the name. Raises :class:`~spectool.errors.CheckpointError`-style
    BadInputError when the config lacks the layer count, hidden size or head count.
    """
    where = ckpt.path / "config.json"
    layers, hidden, heads = ckpt.num_layers, ckpt.hidden_size, ckpt.num_attention_heads
    head_dim = ckpt.head_dim
    if not layers or not hidden or not heads or not head_dim:
        raise BadInputError(
            where, "no layer count, hidden size or attention head count: geometry unknown"
        )
    dense = 0.0
    lm_head = 0.0
    experts: dict[tuple[int, int], float] = {}
    embed = 0.0
    bytes_total = 0.0
    count_total = 0.0
    for raw_name, info in ckpt.tensors.items():
        name = raw_name[len("model.") :] if raw_name.startswith("model.") else raw_name
        layer = _LAYER_RE.search(name)
        if (layer and int(layer.group(1)) >= layers) or name.startswith(("mtp.", "mtp_layers.")):
            continue  # MTP layers: a draft, not the target
        numel = info.numel  # once per tensor: a large MoE holds ~10^5 of them
        bytes_total += info.nbytes
        count_total += numel
        if name in _EMBED_NAMES:
            embed = float(numel)
            continue
        if name == "lm_head.weight":
            lm_head = float(numel)
        expert = _EXPERT_RE.search(name)
        if expert and layer:
            key = (int(layer.group(1)), int(expert.group(1)))
            experts[key] = experts.get(key, 0.0) + numel
        else:
            dense += numel
    own_embedding = embed
    if lm_head == 0.0 and embed:  # tied embeddings: the LM head multiplies by the table
        lm_head = embed
        dense += embed
        own_embedding = 0.0
    bytes_per_param = bytes_total / count_total if count_total else 2.0
    moe_layer_ids = {layer_id for layer_id, _ in experts}
    num_experts = len(experts) // len(moe_layer_ids) if moe_layer_ids else 0
    expert_params = sum(experts.values()) / len(experts) if experts else 0.0
    config = ckpt.text_config
    top_k = _config_int(config, "num_experts_per_tok", "moe_topk", "num_experts_per_token")
    if experts and top_k is None:
        raise BadInputError(where, "routed experts but no num_experts_per_tok: geometry unknown")
    kv_heads = ckpt.num_kv_heads or heads
    kv_elem = DTYPE_BYTES.get(kv_dtype or "", bytes_per_param)
    if ckpt.kv_lora_rank:  # MLA: one latent plus the rope key per token per layer
        rope_dim = _config_int(config, "qk_rope_head_dim") or 64
        kv = layers * (ckpt.kv_lora_rank + rope_dim) * kv_elem
    else:
        kv = 2 * layers * kv_heads * head_dim * kv_elem
    return Geometry(
        name=ckpt.ref,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        head_dim=head_dim,
        dense_params=dense,
        lm_head_params=lm_head,
        kv_bytes_per_token=kv,
        weight_bytes_per_param=bytes_per_param,
        expert_params=expert_params,
        num_experts=num_experts,
        experts_per_token=top_k or 0,
        moe_layers=len(moe_layer_ids),
        embedding_params=own_embedding,
        num_kv_heads=kv_heads,
        kv_latent=bool(ckpt.kv_lora_rank),
        mtp_layers=ckpt.mtp_layers,
    )


_MTP_MODULE_RE = re.compile(r"^(?:mtp\.layers|mtp_layers)\.(\d+)\.")
_SHARED_COPIES = ("embed_tokens.weight", "shared_head.head.weight")


def mtp_geometry_from_checkpoint(
    ckpt: Checkpoint, kv_dtype: str | None = None, *, target: Geometry | None = None
) -> Geometry | None:
    """The first MTP module of a target checkpoint, sized for the step-cost model (one draft
    step is one forward of it); None when the weights hold no MTP module.

    The module's tensors: DeepSeek-V3's layer ``num_hidden_layers`` (``eh_proj``, norms, its
    decoder layer and, when MoE, its experts), Qwen3-Next's ``mtp.layers.0`` plus the shared
    ``mtp.*`` tensors, MiMo's ``mtp_layers.0``. The LM head it multiplies by is the target's
    (``shared_head.head`` when stored, else ``lm_head`` or the tied embedding); a stored
    ``embed_tokens`` copy is a row lookup and is left out, as for every model.
    """
    if target is None:  # the caller's, when it has read it already (same ckpt and kv_dtype)
        target = geometry_from_checkpoint(ckpt, kv_dtype)
    layers = ckpt.num_layers or 0
    module: dict[str, Any] = {}
    for raw_name, info in ckpt.tensors.items():
        name = raw_name[len("model.") :] if raw_name.startswith("model.") else raw_name
        layer = _LAYER_RE.match(name)
        numbered = _MTP_MODULE_RE.match(name)
        if layer is not None and name.startswith("layers."):
            if int(layer.group(1)) != layers:
                continue
        elif numbered is not None:
            if int(numbered.group(1)) != 0:
                continue
        elif not name.startswith("mtp."):
            continue
        module[name] = info
    if not any(("eh_proj" in n or "enorm" in n or n.startswith("mtp")) for n in module):
        return None
    dense = 0.0
    lm_head = 0.0
    experts: dict[int, float] = {}
    bytes_total = count_total = 0.0
    for name, info in module.items():
        if name.endswith(_SHARED_COPIES[0]):
            continue
        bytes_total += info.nbytes
        count_total += info.numel
        if name.endswith(_SHARED_COPIES[1]):
            lm_head = float(info.numel)
            continue
        expert = _EXPERT_RE.search(name)
        if expert:
            experts[int(expert.group(1))] = experts.get(int(expert.group(1)), 0.0) + info.numel
        else:
            dense += info.numel
    lm_head = lm_head or target.lm_head_params
    kv_per_layer = target.kv_bytes_per_token / target.num_layers
    return Geometry(
        name=f"{ckpt.ref} MTP module",
        num_layers=1,
        hidden_size=target.hidden_size,
        num_attention_heads=target.num_attention_heads,
        head_dim=target.head_dim,
        dense_params=dense + lm_head,
        lm_head_params=lm_head,
        kv_bytes_per_token=kv_per_layer,
        weight_bytes_per_param=bytes_total / count_total if count_total else 2.0,
        expert_params=sum(experts.values()) / len(experts) if experts else 0.0,
        num_experts=len(experts),
        experts_per_token=target.experts_per_token if experts else 0,
        moe_layers=1 if experts else 0,
    )
