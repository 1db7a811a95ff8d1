"""Memory per rank from a profile's ``geometry`` block: ``check`` and ``build`` offline.

When the checkpoints' headers cannot be read, :func:`rank_memory_from_geometry` builds the same
per-rank table as :func:`spectool.memory_ranks.rank_memory` (same placement rules, same
:func:`~spectool.memory_ranks.stage_table`) from the sizes a profile carries
(:class:`spectool.predict.geometry.Geometry`), in bytes at the geometry's ``weight_dtype``:

* the non-expert weights of the layers are spread evenly over the layers
  (``dense_params - lm_head_params``, divided by ``num_layers``): the headers would say which
  layers hold a dense MLP, a profile does not, so a PP stage's share is the average;
* routed experts (``num_experts x expert_params`` per MoE layer) sit on the last ``moe_layers``
  layers (DeepSeek-V3's ``first_k_dense_replace`` dense layers come first);
* the input embedding is ``embedding_params`` (0: tied, the LM head's table serves both);
* MTP (``mtp_layers`` modules): each one decoder layer of the target (its average non-expert
  weights, plus one MoE layer's experts) and its ``eh_proj`` (``2 x hidden x hidden``: DeepSeek-V3's
  MTP module, ``tensorrt_llm/_torch/models/modeling_deepseekv3.py`` ``DeepseekV3MTP``), sharing the
  target's embedding and LM head; its KV is its layers' share of the target's;
* a drafter with its own geometry (EAGLE-3 head, draft model): its ``dense_params`` plus its own
  ``embedding_params``, and its own ``kv_bytes_per_token``;
* KV per rank: whole under attention DP or for a latent (MLA) cache (``kv_latent``), else split
  over TP by KV heads (``num_kv_heads``; at least one head per rank).

A geometry without ``embedding_params``, or without ``num_kv_heads`` where TP splits the KV
cache, is refused (:class:`BadInputError`, exit 2): a missing size is never a default.
"""

from __future__ import annotations

from spectool import methods
from spectool.errors import BadInputError
from spectool.memory import MemoryEstimate
from spectool.memory_ranks import WeightSplit, stage_table
from spectool.parallel import ParallelLayout
from spectool.predict.geometry import Geometry


def _need(value: object, field: str, where: str) -> None:
    if value is None:
        raise BadInputError(
            where,
            f"the geometry block has no {field}, needed for memory per rank; regenerate it with "
            "scripts/profile_geometry.py",
        )


def kv_share(geom: Geometry, layout: ParallelLayout, where: str) -> float:
    """The fraction of ``geom``'s KV cache bytes one rank keeps (per layer it holds)."""
    if layout.attention_dp or geom.kv_latent or layout.tp == 1:
        return 1.0
    _need(geom.num_kv_heads, "num_kv_heads", where)
    heads = geom.num_kv_heads or 1
    return max(1, heads // layout.tp) / heads


def split_from_geometry(target: Geometry, *, mtp: bool, where: str) -> WeightSplit:
    """A :class:`WeightSplit` (bytes) of ``target`` (the module docstring's rules)."""
    _need(target.embedding_params, "embedding_params", where)
    bpp = target.weight_bytes_per_param
    layers = target.num_layers
    per_layer = (target.dense_params - target.lm_head_params) / layers * bpp
    expert_layer = target.num_experts * target.expert_params * bpp if target.is_moe else 0.0
    first_moe = layers - target.moe_layers
    tied = not target.embedding_params
    table = target.lm_head_params * bpp
    split = WeightSplit(
        num_layers=layers,
        layer_dense=[int(per_layer)] * layers,
        layer_experts=[int(expert_layer) if i >= first_moe else 0 for i in range(layers)],
        embedding=int(table if tied else (target.embedding_params or 0) * bpp),
        lm_head=0 if tied else int(table),
        tied=tied,
    )
    if mtp:
        if not target.mtp_layers:
            raise BadInputError(where, "method mtp, but the target's geometry has no mtp_layers")
        eh_proj = 2 * target.hidden_size * target.hidden_size * bpp
        split.mtp_dense = int(target.mtp_layers * (per_layer + eh_proj))
        split.mtp_experts = int(target.mtp_layers * expert_layer)
    return split


def rank_memory_from_geometry(
    target: Geometry,
    drafter: Geometry | None,
    method: str,
    layout: ParallelLayout,
    *,
    where: str,
    gpu_name: str,
    gpu_memory_bytes: int,
    max_seq_len: int,
    max_draft_len: int,
) -> MemoryEstimate:
    """The per-rank table of ``layout`` from geometry; the tightest stage's estimate."""
    kind = methods.get(method).drafter_memory
    native = kind == "native_layers_kv"
    split = split_from_geometry(target, mtp=native, where=where)
    share = kv_share(target, layout, where)
    kv_per_layer = target.kv_bytes_per_token / target.num_layers * share
    div = 1 if layout.attention_dp else layout.tp
    placement = "every rank, " + (
        "replicated (attention DP)" if layout.attention_dp else "TP-split"
    )
    d_bytes, d_kv = 0, 0
    if native:
        d_bytes = split.mtp_dense // div + split.mtp_experts // layout.tp
        d_kv = int(kv_per_layer * target.mtp_layers)
    elif kind != "none":
        if drafter is None:
            raise BadInputError(where, f"method {method} needs the drafter's geometry")
        _need(drafter.embedding_params, "embedding_params (drafter)", where)
        own = drafter.dense_params + (drafter.embedding_params or 0)
        d_bytes = int(own * drafter.weight_bytes_per_param) // div
        if kind != "head_no_kv":
            d_kv = int(drafter.kv_bytes_per_token * kv_share(drafter, layout, where))
    else:
        placement = "none"
    return stage_table(
        split,
        layout,
        experts=target.num_experts or None,
        stage_kv=lambda n: int(kv_per_layer * n),
        drafter_bytes=d_bytes,
        drafter_placement=placement,
        drafter_kv=d_kv,
        hidden_size=target.hidden_size,
        gpu_name=gpu_name,
        gpu_memory_bytes=gpu_memory_bytes,
        max_seq_len=max_seq_len,
        max_draft_len=max_draft_len,
    )
