"""Memory per rank for a parallel layout (:class:`spectool.parallel.ParallelLayout`).

The target's weights are split by what they are, from the checkpoint's tensor table (headers
only): per decoder layer its routed experts (``experts.<n>.`` in the name), the rest of the layer
(attention, norms, dense MLP, shared experts, router), the input embedding and the LM head (with
the final norm). Per rank, following TensorRT-LLM's ``Mapping`` (``tensorrt_llm/mapping.py``):

* **PP** gives each stage its layers (:func:`spectool.parallel.pp_stage_layers`, TensorRT-LLM's
  ``pp_layers``); spectool puts the embedding on the first stage and the LM head and final norm
  on the last (the usual placement; not read in TensorRT-LLM's source). Ranks run TP-fastest:
  ``tp_rank = rank % tp_size``, ``pp_rank = rank // tp_size`` (``Mapping.__init__``).
* **TP** splits the non-expert weights of a layer, the embedding and the LM head over ``tp``.
* **EP** places ``num_experts / ep`` experts on each rank and ``moe_tp = tp / ep`` splits each of
  them (``moe_tp_size * moe_ep_size == tp_size``), so each rank holds ``1 / tp`` of the experts'
  bytes, as ``num_experts / ep`` whole experts cut ``moe_tp`` ways.
* **Attention DP** replicates attention on every rank. spectool counts every non-expert weight
  (attention, dense MLPs, shared experts, embedding, LM head) replicated then: an upper bound, read
  in TensorRT-LLM only for the EAGLE-3 draft layers (below), assumed for the target.

The drafter (placement from ``tensorrt_llm/_torch/models/modeling_speculative.py`` @
b35ac1b64368): ``SpecDecOneEngineForCausalLM.__init__`` builds the one-model draft module on every
rank with no pipeline-stage condition, so spectool counts it on every stage (an upper bound for
PP). EAGLE-3 heads: ``Eagle3Attention`` / ``Eagle3DecoderLayer`` are TP-split, replicated
(``tp_size = 1``) under attention DP. MTP: ``MTPForCausalLM`` builds the ``DeepseekV3MTP`` layers
and shares the target's ``embed_tokens`` and ``lm_head``, so the checkpoint's copies of those
(``embed_tokens``, ``shared_head.head`` in the MTP layer) are not counted; its experts split like
the target's. Two-model drafters (draft models) are counted TP-split on every stage.

KV cache per rank: the stage's layers only; KV heads split by TP (not under attention DP, where
each rank keeps whole heads for its own sequences; latent MLA caches are never split).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from spectool import methods
from spectool.ckpt.inspect import Checkpoint
from spectool.memory import MemoryEstimate, drafter_footprint, kv_bytes_per_token, memory_budget
from spectool.parallel import ParallelLayout, moe_experts, pp_stage_layers

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# a multimodal checkpoint's vision side: counted with the embedding (first stage)
_VISION = ("vision", "visual", "multi_modal_projector")
_EXPERT_RE = re.compile(r"(?:^|\.)experts\.(\d+)\.")
_EMBED = ("embed_tokens.weight", "tok_embeddings.weight", "wte.weight")
# copies of the target's tensors inside a DeepSeek MTP layer that TensorRT-LLM shares instead
_MTP_SHARED = ("embed_tokens.weight", "shared_head.head.weight")


@dataclass
class WeightSplit:
    """Bytes of a target checkpoint by kind (see the module docstring)."""

    num_layers: int
    layer_dense: list[int]
    layer_experts: list[int]
    embedding: int = 0
    lm_head: int = 0  # LM head and every other tensor outside the layers (final norm)
    tied: bool = False
    mtp_dense: int = 0
    mtp_experts: int = 0

    @property
    def total(self) -> int:
        return sum(self.layer_dense) + sum(self.layer_experts) + self.embedding + self.lm_head


def split_weights(ckpt: Checkpoint) -> WeightSplit:
    layers = ckpt.num_layers or 0
    split = WeightSplit(layers, [0] * layers, [0] * layers)
    has_lm_head = False
    for raw, info in ckpt.tensors.items():
        name = raw[len("model.") :] if raw.startswith("model.") else raw
        size = info.nbytes
        layer = _LAYER_RE.search(raw)
        expert = _EXPERT_RE.search(name) is not None
        if any(word in name for word in _VISION):
            split.embedding += size
        elif (layer and int(layer.group(1)) >= layers) or name.startswith(("mtp.", "mtp_layers.")):
            if name.endswith(_MTP_SHARED):
                continue
            if expert:
                split.mtp_experts += size
            else:
                split.mtp_dense += size
        elif layer:
            i = int(layer.group(1))
            if expert:
                split.layer_experts[i] += size
            else:
                split.layer_dense[i] += size
        elif name in _EMBED:
            split.embedding += size
        else:
            has_lm_head = has_lm_head or name == "lm_head.weight"
            split.lm_head += size
    split.tied = not has_lm_head
    return split


@dataclass(frozen=True)
class RankMemory:
    """One pipeline stage: its ``tp`` ranks hold the same amounts (bytes per GPU)."""

    stage: int
    ranks: str
    nodes: str
    layers: str
    attention_dense_bytes: int  # non-expert layer weights (attention, dense MLP, shared experts)
    expert_bytes: int
    experts_per_rank: int | None  # routed experts of each MoE layer on one rank
    embedding_bytes: int  # input embedding and/or LM head on this stage
    drafter_bytes: int
    drafter_placement: str
    weight_bytes: int  # target + drafter
    kv_bytes_per_token: int
    drafter_kv_bytes_per_token: int
    sequences_without_drafter: int
    sequences_with_drafter: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _span(values: range) -> str:
    return f"{values.start}-{values.stop - 1}" if len(values) > 1 else str(values.start)


def _drafter_bytes(
    target: Checkpoint,
    drafter: Checkpoint | None,
    method: str,
    split: WeightSplit,
    layout: ParallelLayout,
) -> tuple[int, str]:
    kind = methods.get(method).drafter_memory
    div = 1 if layout.attention_dp else layout.tp
    placement = "every rank, " + (
        "replicated (attention DP)" if layout.attention_dp else "TP-split"
    )
    if kind == "none":
        return 0, "none"
    if kind == "native_layers_kv":
        return split.mtp_dense // div + split.mtp_experts // layout.tp, placement
    if drafter is None:
        return 0, "none"
    return drafter.weight_bytes // div, placement


def rank_memory(
    target: Checkpoint,
    drafter: Checkpoint | None,
    method: str,
    layout: ParallelLayout,
    *,
    gpu_name: str,
    gpu_memory_bytes: int,
    max_seq_len: int,
    max_draft_len: int,
) -> MemoryEstimate:
    """The memory estimate of the tightest stage, with the whole per-rank table in ``per_rank``."""
    split = split_weights(target)
    kv_tp = 1 if layout.attention_dp else layout.tp
    d_bytes, placement = _drafter_bytes(target, drafter, method, split, layout)
    _, d_kv = drafter_footprint(target, drafter, method, kv_tp)
    return stage_table(
        split,
        layout,
        experts=moe_experts(target.text_config),
        stage_kv=lambda n: kv_bytes_per_token(target, layers=n, tp=kv_tp) if n else 0,
        drafter_bytes=d_bytes,
        drafter_placement=placement,
        drafter_kv=d_kv,
        hidden_size=target.hidden_size or 0,
        gpu_name=gpu_name,
        gpu_memory_bytes=gpu_memory_bytes,
        max_seq_len=max_seq_len,
        max_draft_len=max_draft_len,
    )


def stage_table(
    split: WeightSplit,
    layout: ParallelLayout,
    *,
    experts: int | None,
    stage_kv: Callable[[int], int],
    drafter_bytes: int,
    drafter_placement: str,
    drafter_kv: int,
    hidden_size: int,
    gpu_name: str,
    gpu_memory_bytes: int,
    max_seq_len: int,
    max_draft_len: int,
) -> MemoryEstimate:
    """One row per pipeline stage from a :class:`WeightSplit` (bytes of the whole model);
    ``stage_kv(n)``: target KV bytes per token of ``n`` layers on one rank. The estimate of the
    tightest stage, with the table in ``per_rank``."""
    div = 1 if layout.attention_dp else layout.tp
    stages = pp_stage_layers(split.num_layers, layout.pp) if split.num_layers else [range(0)]
    rows: list[RankMemory] = []
    estimates: list[MemoryEstimate] = []
    for stage, layers in enumerate(stages):
        first, last = stage == 0, stage == len(stages) - 1
        dense = sum(split.layer_dense[i] for i in layers) // div
        expert = sum(split.layer_experts[i] for i in layers) // layout.tp
        embed = 0
        if first:
            embed += split.embedding // div
        if last:
            embed += split.lm_head // div
            if split.tied and not first:
                embed += split.embedding // div  # the LM head multiplies by the table
        t_bytes = dense + expert + embed
        t_kv = stage_kv(len(layers))
        est = memory_budget(
            gpu_name=gpu_name,
            gpu_memory_bytes=gpu_memory_bytes,
            tp=layout.tp,
            max_seq_len=max_seq_len,
            max_draft_len=max_draft_len,
            hidden_size=hidden_size,
            target_weight_bytes=t_bytes,
            target_kv_bytes_per_token=t_kv,
            drafter_weight_bytes=drafter_bytes,
            drafter_kv_bytes_per_token=drafter_kv,
        )
        estimates.append(est)
        ranks = range(stage * layout.tp, (stage + 1) * layout.tp)
        nodes = range(
            ranks.start // layout.gpus_per_node, (ranks.stop - 1) // layout.gpus_per_node + 1
        )
        rows.append(
            RankMemory(
                stage=stage,
                ranks=_span(ranks),
                nodes=_span(nodes),
                layers=_span(layers) if len(layers) else "-",
                attention_dense_bytes=dense,
                expert_bytes=expert,
                experts_per_rank=experts // layout.ep if experts else None,
                embedding_bytes=embed,
                drafter_bytes=drafter_bytes,
                drafter_placement=drafter_placement,
                weight_bytes=t_bytes + drafter_bytes,
                kv_bytes_per_token=t_kv,
                drafter_kv_bytes_per_token=drafter_kv,
                sequences_without_drafter=est.sequences_without_drafter,
                sequences_with_drafter=est.sequences_with_drafter,
            )
        )
    worst = min(estimates, key=lambda e: (e.sequences_with_drafter, e.sequences_without_drafter))
    return _with_table(worst, layout, rows)


def _with_table(
    est: MemoryEstimate, layout: ParallelLayout, rows: list[RankMemory]
) -> MemoryEstimate:
    return replace(
        est,
        layout=_layout_json(layout),
        per_rank=tuple(r.to_json() for r in rows),
    )


def _layout_json(layout: ParallelLayout) -> dict[str, Any]:
    return {**asdict(layout), "world_size": layout.world_size}
