"""Step cost of a parallel layout: TP all-reduces, attention DP's MoE exchange, the pipeline.

:func:`spectool.predict.cost.forward_cost` prices one forward on ``tp`` GPUs of one node. For a
:class:`~spectool.parallel.ParallelLayout` (issue 25) this module adds, after what TensorRT-LLM's
PyTorch backend does (NVIDIA/TensorRT-LLM, files and commits named per rule):

* **Links.** Collectives inside a node run over NVLink (``Hardware.link_bandwidth``); a TP group
  or a pipeline-stage boundary that spans nodes runs over the inter-node network
  (``Hardware.internode_bandwidth``, 400 Gb/s InfiniBand per GPU = 50 GB/s: the NVIDIA DGX
  H100/B200 datasheets list eight ConnectX-7 400 Gb/s ports, one per GPU;
  :data:`spectool.predict.cost.INTERNODE_GBS`). Ranks are TP-fastest
  (``tp_rank = rank % tp_size``, ``pp_rank = rank // tp_size``, ``tensorrt_llm/mapping.py``
  ``Mapping.__init__`` @ 05ebebb2c1d3), node ``rank // gpus_per_node``.
* **TP** without attention DP: :func:`forward_cost` as it is (two all-reduces of ``n x hidden``
  BF16 per layer). EP without attention DP changes no byte count: each rank holds ``1/tp`` of
  every MoE layer's expert bytes (``moe_tp_size * moe_ep_size == tp_size``), and the CUTLASS
  MoE's output goes through ``reducescatter_or_allreduce`` like a dense MLP's.
* **Attention DP** (``enable_attention_dp``): each of the ``tp`` ranks runs attention, norms,
  dense MLPs, shared experts and the LM head replicated (as :mod:`spectool.memory_ranks` counts
  them) for its own ``batch / tp`` sequences, with its own KV cache; an idle rank runs a dummy
  request (``PyExecutor._pad_attention_dp_dummy_request``), so each rank carries at least one
  sequence. Each MoE layer then all-gathers every rank's tokens before the experts and
  reduce-scatters after them (``CutlassFusedMoE``: ``allgather([x, ...], sizes=
  all_rank_num_tokens)`` when ``use_dp and parallel_size > 1``, then
  ``reducescatter_or_allreduce``; ``tensorrt_llm/_torch/modules/fused_moe/fused_moe_cutlass.py``
  @ 000a01de66f0). Per rank each moves ``(tp-1)/tp x N x hidden`` BF16 values, ``N`` the
  tokens of all ranks (DeepSeek's block-FP8 path gathers unquantised inputs). That equals an
  all-to-all's dispatch of ``N/tp x top_k x hidden`` when ``top_k = tp`` (DeepSeek-V3: 8 on 8);
  the all-to-all backends (``enable_alltoall``, wide EP) are not modelled separately.
  Experts touched: those of all ``N`` tokens, ``1/tp`` of their bytes on each rank.
* **PP**: stage ``i`` holds TensorRT-LLM's ``pp_layers`` (:func:`spectool.parallel.pp_stage_layers`);
  only the last stage runs the LM head (``DecoderModelForCausalLM.__pp_init__`` skips the
  ``lm_head`` epilogue elsewhere) and so the one-model drafter, which needs its logits, and the
  sampler. Between stages each rank sends its ``hidden_states`` and ``residual``
  (``forward_after_recv`` / ``pp_recv_tensors([hidden_states, residual])``,
  ``tensorrt_llm/_torch/models/modeling_utils.py`` @ 000a01de66f0): ``2 x n x hidden`` BF16.
  ``PyExecutor`` runs ``_executor_loop_pp`` whenever ``pp_size > 1``, with
  ``num_micro_batches = pp_size`` (``tensorrt_llm/_torch/pyexecutor/py_executor.py``
  @ 0004396720054f, default synchronous sample-state relay). So ``c`` requests go in
  ``m = min(pp, c)`` micro-batches of ``max(1, c / pp)``; one request's step crosses every stage
  in turn, and the stages work on different micro-batches at once. A request's step is
  :func:`pipelined`: ``max(sum of stage times, m x the slowest stage)``: the sum at
  concurrency 1 (the whole bubble: ``pp - 1`` of ``pp`` stages idle), the slowest stage times
  ``pp`` once every stage has a micro-batch. Stage times include each stage's send.
* **Speculation**: the verify forward carries ``k + 1`` tokens per sequence through every
  collective and every stage send; MTP and EAGLE-3 draft forwards run on the last stage's ranks
  with the same collectives (an MTP layer's MoE exchange under attention DP; an EAGLE-3 head is
  replicated under attention DP, ``Eagle3Attention`` with ``tp_size = 1``, so it has none).
  Two-model drafting cannot run with PP: ``PyExecutor.__init__`` raises ``NotImplementedError``
  ("Drafting is not supported for selected executor loop") when a separate drafter meets
  ``_executor_loop_pp`` (same file @ 0004396720054f); :data:`PP_REFUSED_METHODS`.

Every collective and send pays ``EngineFactors.allreduce_s`` of latency and moves its bytes at
``link x link_fraction``. Pure functions, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from spectool.parallel import ParallelLayout, pp_stage_layers
from spectool.predict.cost import EngineFactors, Hardware, StepCost, forward_cost, overhead_s
from spectool.predict.geometry import Geometry

ACT_BYTES = 2.0  # activations travel in BF16
# Methods TensorRT-LLM's PP executor loop refuses (two-model drafters; see the docstring)
PP_REFUSED_METHODS = ("draft_model", "ngram")


def node_of(layout: ParallelLayout, rank: int) -> int:
    return rank // layout.gpus_per_node


def tp_spans_nodes(layout: ParallelLayout) -> bool:
    """Whether some stage's TP group has ranks on two nodes."""
    for stage in range(layout.pp):
        first = stage * layout.tp
        if node_of(layout, first) != node_of(layout, first + layout.tp - 1):
            return True
    return False


def boundary_spans_nodes(layout: ParallelLayout, stage: int) -> bool:
    """Whether the send from ``stage`` to ``stage + 1`` leaves the node (rank j of one stage's
    TP group sends to rank j of the next)."""
    return any(
        node_of(layout, stage * layout.tp + j) != node_of(layout, (stage + 1) * layout.tp + j)
        for j in range(layout.tp)
    )


def tp_hardware(hw: Hardware, layout: ParallelLayout) -> Hardware:
    """``hw`` with its TP link: the inter-node network when a TP group spans nodes."""
    if tp_spans_nodes(layout):
        return replace(hw, link_bandwidth=hw.internode_bandwidth)
    return hw


def rank_forward(
    geom: Geometry,
    hw: Hardware,
    f: EngineFactors,
    batch: float,
    tokens: float,
    context: float,
    layout: ParallelLayout,
) -> StepCost:
    """One forward of ``geom`` (a whole model or one stage of it) on one rank of ``layout``'s TP
    group, ``batch`` sequences of ``tokens`` tokens over the group; see the module docstring."""
    hw = tp_hardware(hw, layout)
    if not layout.attention_dp or layout.tp == 1:
        return forward_cost(geom, hw, f, batch, tokens, context, layout.tp)
    tp = layout.tp
    local = max(1.0, batch / tp)  # sequences per rank (a dummy request on an idle one)
    n_local = local * tokens
    n_all = n_local * tp  # tokens of every rank, all-gathered into each MoE layer
    bpp = geom.weight_bytes_per_param
    dense_bytes = geom.dense_params * bpp
    expert_bytes = geom.moe_layers * geom.distinct_experts(n_all) * geom.expert_params * bpp / tp
    kv_bytes = local * context * geom.kv_bytes_per_token
    attn_flops = 4.0 * geom.num_layers * geom.num_attention_heads * geom.head_dim * context
    expert_active = geom.moe_layers * geom.experts_per_token * geom.expert_params
    flops = (2.0 * geom.dense_params + attn_flops) * n_local + 2.0 * expert_active * n_all / tp
    memory_s = (dense_bytes + expert_bytes + kv_bytes) / (hw.bandwidth * f.bw_fraction)
    compute_s = flops / (hw.flops_for(bpp) * f.flops_fraction)
    roof = max(memory_s, compute_s) if f.overlap else memory_s + compute_s
    overhead = overhead_s(geom, f, tokens, local)
    exchange = moe_exchange_s(geom, hw, f, n_all, tp)
    return StepCost(
        seconds=roof + overhead + exchange,
        weight_bytes=dense_bytes + expert_bytes,
        kv_bytes=kv_bytes,
        flops=flops,
        memory_s=memory_s,
        compute_s=compute_s,
        overhead_s=overhead,
        allreduce_s=exchange,
        parts={"dense_bytes": dense_bytes, "expert_bytes": expert_bytes},
    )


def moe_exchange_s(geom: Geometry, hw: Hardware, f: EngineFactors, n_all: float, tp: int) -> float:
    """Attention DP's all-gather + reduce-scatter around every MoE layer of ``geom``, ``n_all``
    tokens over ``tp`` ranks."""
    if tp <= 1 or not geom.is_moe:
        return 0.0
    moved = (tp - 1) / tp * n_all * geom.hidden_size * ACT_BYTES
    one = f.allreduce_s + moved / (hw.link_bandwidth * f.link_fraction)
    return geom.moe_layers * 2 * one


def send_s(hw: Hardware, f: EngineFactors, tokens: float, hidden: int, internode: bool) -> float:
    """One stage-to-stage send of ``hidden_states`` and ``residual`` for ``tokens`` tokens."""
    link = hw.internode_bandwidth if internode else hw.link_bandwidth
    return f.allreduce_s + 2 * tokens * hidden * ACT_BYTES / (link * f.link_fraction)


def stage_geometry(geom: Geometry, layers: range, last: bool) -> Geometry:
    """``geom`` cut to one pipeline stage: its layers' share of the dense weights and KV, the
    MoE layers among them (MoE layers are the model's last ``moe_layers``, as in DeepSeek-V3),
    and the LM head on the last stage only."""
    per_layer = (geom.dense_params - geom.lm_head_params) / geom.num_layers
    first_moe = geom.num_layers - geom.moe_layers
    return replace(
        geom,
        num_layers=len(layers),
        dense_params=per_layer * len(layers) + (geom.lm_head_params if last else 0.0),
        lm_head_params=geom.lm_head_params if last else 0.0,
        kv_bytes_per_token=geom.kv_bytes_per_token / geom.num_layers * len(layers),
        moe_layers=sum(1 for i in layers if i >= first_moe),
    )


def micro_batches(layout: ParallelLayout, concurrency: float) -> tuple[float, float]:
    """``(m, b)``: micro-batches in flight and sequences in each, ``c`` requests over
    ``num_micro_batches = pp_size``."""
    m = max(1.0, min(float(layout.pp), concurrency))
    return m, max(1.0, concurrency / layout.pp)


def stage_seconds(
    geom: Geometry,
    hw: Hardware,
    f: EngineFactors,
    batch: float,
    tokens: float,
    context: float,
    layout: ParallelLayout,
) -> list[float]:
    """Each stage's forward of a ``batch``-sequence micro-batch, its send to the next included."""
    if layout.pp == 1:
        return [rank_forward(geom, hw, f, batch, tokens, context, layout).seconds]
    stages = pp_stage_layers(geom.num_layers, layout.pp)
    out = []
    for i, layers in enumerate(stages):
        last = i == len(stages) - 1
        seconds = rank_forward(
            stage_geometry(geom, layers, last), hw, f, batch, tokens, context, layout
        ).seconds
        if not last:
            local = max(1.0, batch / layout.tp) if layout.attention_dp else batch
            seconds += send_s(
                hw, f, local * tokens, geom.hidden_size, boundary_spans_nodes(layout, i)
            )
        out.append(seconds)
    return out


def pipelined(stages: Sequence[float], in_flight: float) -> float:
    """A request's step through the stages with ``in_flight`` micro-batches sharing them:
    ``max(sum, in_flight x max)``."""
    return max(sum(stages), in_flight * max(stages))
