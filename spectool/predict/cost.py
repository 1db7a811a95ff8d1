"""Time of one forward pass: a roofline of bytes moved against FLOPs, plus fixed overheads.

For a model of :class:`~spectool.predict.geometry.Geometry` at batch ``b`` with ``t`` tokens per
sequence (``n = b t``) and context ``L`` tokens, on ``tp`` GPUs:

* bytes = (dense weights + MoE layers x distinct experts touched by ``n`` tokens x expert
  weights) / tp + b x L x KV bytes per token / tp (not split for a latent MLA cache: every TP
  rank keeps the whole latent of its sequences, as :mod:`spectool.memory_ranks` counts it)
* FLOPs = (2 x active params x n + 4 x layers x heads x head_dim x L x n) / tp
* time = overhead_forward + layers x overhead_layer (+ multi-token extra when t > 1)
  + b x overhead_seq
  + max(bytes / (bandwidth x bw_fraction), FLOPs / (peak x flops_fraction))
  (the sum instead of the max when ``overlap`` is False: a CPU running one op at a time)
  + with tp > 1: 2 x layers all-reduces of ``n x hidden x 2`` bytes at
  ``link_gbs x link_fraction`` plus ``allreduce_us`` each.

Layouts beyond TP on one node (PP, attention DP, a TP group across nodes) are
:mod:`spectool.predict.parallel_cost`'s, on top of this.

:class:`Hardware` is what the device can do (peak figures, from a GPU profile or the CPU probe);
:class:`EngineFactors` what an engine achieves of it (calibration).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from spectool.predict.geometry import Geometry

if TYPE_CHECKING:
    from spectool.profiles import GpuSpec

# GPU-to-GPU bandwidth per direction in GB/s, by GPU profile stem (NVLink where the part has it,
# else PCIe). Sources: NVIDIA datasheets (H100/H200 SXM NVLink 4: 900 GB/s bidirectional; A100
# SXM NVLink 3: 600; B200/GB200 NVLink 5: 1,800; H100 PCIe NVLink bridge: 600); PCIe Gen4 x16
# 32 GB/s per direction (A10G, L4, L40S, RTX 4090), Gen5 64.
LINK_GBS: dict[str, float] = {
    "h100-sxm": 450,
    "h200": 450,
    "gb200": 900,
    "b200": 900,
    "a100-80gb": 300,
    "a100-40gb": 300,
    "h100-pcie": 300,
    "l40s": 32,
    "l4": 32,
    "a10g": 32,
    "rtx-4090": 32,
}
# Per-GPU inter-node bandwidth per direction, GB/s: 400 Gb/s InfiniBand NDR (ConnectX-7), one
# port per GPU on NVIDIA DGX H100 and DGX B200 (their datasheets: "8x ... ConnectX-7 ...
# 400 Gb/s InfiniBand/Ethernet"); a site with a slower fabric gets a faster prediction.
INTERNODE_GBS = 50.0


@dataclass(frozen=True)
class Hardware:
    """Peak figures of one device: memory bandwidth (bytes/s), dense FLOP/s per weight dtype
    class (16-bit and 8-bit; ``fp8_flops`` None = no FP8 tensor cores), GPU-to-GPU bandwidth
    within a node and per GPU between nodes (``internode_bandwidth``, 400 Gb/s InfiniBand:
    :data:`INTERNODE_GBS`)."""

    name: str
    bandwidth: float
    flops16: float
    fp8_flops: float | None = None
    link_bandwidth: float = 32e9
    internode_bandwidth: float = INTERNODE_GBS * 1e9

    @classmethod
    def from_gpu(cls, gpu: GpuSpec, stem: str | None = None) -> Hardware:
        """From a GPU profile (``spectool.profiles.GpuSpec``); ``stem`` picks its link speed."""
        from spectool.profiles import normalize_name

        link = 32.0
        keys = {normalize_name(n) for n in (gpu.name, *gpu.aliases, stem or "")}
        for gpu_stem, gbs in LINK_GBS.items():
            if normalize_name(gpu_stem) in keys:
                link = gbs
                break
        return cls(
            name=gpu.name,
            bandwidth=gpu.bandwidth_bytes_per_s,
            flops16=gpu.bf16_dense_tflops * 1e12,
            fp8_flops=gpu.fp8_dense_tflops * 1e12 if gpu.fp8_dense_tflops else None,
            link_bandwidth=link * 1e9,
        )

    def flops_for(self, bytes_per_param: float) -> float:
        """Peak dense FLOP/s for weights of this size (8-bit and smaller use FP8 where present)."""
        if bytes_per_param <= 1.0 and self.fp8_flops:
            return self.fp8_flops
        return self.flops16


@dataclass(frozen=True)
class EngineFactors:
    """What an engine achieves of a device, and what it adds per step (the calibration).

    ``bw_fraction`` / ``flops_fraction``: achieved share of peak bandwidth / FLOP/s.
    ``step_overhead_s``: fixed cost of one engine iteration, paid once per decode step whatever
    it runs (scheduling, sampling, host work; not part of :func:`forward_cost`).
    ``forward_overhead_s``: fixed cost of each forward pass (a CUDA-graph launch; on a CPU the
    Python call, embedding, final norm and the host's arg-max).
    ``layer_overhead_s``: per decoder layer per forward (kernel launches; ~0 with CUDA graphs).
    ``moe_layer_overhead_s``: extra per MoE layer per forward (routing top-k, token sort and
    alignment, the grouped-GEMM launch: kernels that move few bytes but take time).
    ``multi_token_forward_s``: extra per forward when sequences carry more than one token
    (building the causal mask, picking the positions that reach the LM head).
    ``multi_token_layer_s``: extra per layer when sequences carry more than one token (verify
    and catch-up forwards: attention with a causal mask instead of the decode kernel).
    ``seq_overhead_s``: per sequence per forward (host bookkeeping, per-row sampling).
    ``seq_layer_overhead_s``: per sequence per layer (a CPU gathering each sequence's KV rows
    and running its attention separately; ~0 on GPUs, where the KV bytes cover it).
    ``spec_overhead_s`` / ``spec_seq_overhead_s``: per speculative step, fixed and per sequence
    (acceptance, KV rollback). ``draft_step_overhead_s``: per draft step (one drafter, head or
    MTP forward): its sampling, the draft-token bookkeeping and the launches outside a CUDA graph;
    a sweep over k prices it (published sweeps peak at k = 2-4, issue 23). ``allreduce_s``: latency of one all-reduce; ``link_fraction``:
    achieved share of GPU-to-GPU bandwidth. ``overlap``: roofline max (GPU) or sum (a CPU that
    runs one op at a time). ``source``: where the numbers come from.
    """

    bw_fraction: float
    flops_fraction: float
    step_overhead_s: float
    forward_overhead_s: float = 0.0
    layer_overhead_s: float = 0.0
    multi_token_layer_s: float = 0.0
    multi_token_forward_s: float = 0.0
    moe_layer_overhead_s: float = 0.0
    seq_overhead_s: float = 0.0
    seq_layer_overhead_s: float = 0.0
    spec_overhead_s: float = 0.0
    spec_seq_overhead_s: float = 0.0
    draft_step_overhead_s: float = 0.0
    allreduce_s: float = 10e-6
    link_fraction: float = 0.7
    overlap: bool = True
    source: str = ""

    def but(self, **changes: float | bool | str) -> EngineFactors:
        return replace(self, **changes)  # type: ignore[arg-type]


# Default factors per engine: engine-level, never per model or row, fitted by component
# (spectool.predict.loso.fit_engine_defaults over tests/data/published; see its SOURCES.md):
# * stage 1, the plain decode step: bw_fraction, step_overhead_s and layer_overhead_s on the
#   grids of spectool.predict.calibrate.DEFAULT_GRIDS, fitted to published ABSOLUTE speeds
#   without speculation (baselines.csv: TensorRT-LLM's performance tables v0.5-v0.6.1, its
#   H200, H100-vs-A100 and Falcon-180B blogs and tech blog 1; vLLM PRs #16035/#16937, issue
#   #20780 and AngelSlim's README; SGLang in SpecForge #339, AngelSlim #163, EAGLE PR #173 and
#   issue #251). TensorRT-LLM v0.5-v0.6 read a GQA KV cache once per query head (the rows say
#   so: baselines.csv attention_kv); fitted without that, its stage 1 had tried 200 us per
#   layer and no iteration overhead to slow down its long-output Llama-2-70B / Falcon-180B
#   rows, and missed DeepSeek-R1's batch-1 step by 53 %. flops_fraction stays at the a-priori
#   0.6 (large GEMMs reach 55-70 % of dense peak on H100; refitting it to 0.5 moves the
#   large-batch rows by a few per cent and costs 5x the fitting time).
# * stage 2, the speculative parts with stage 1 fixed: spec_overhead_s (per speculative step),
#   and draft_step_overhead_s (per draft forward: sampling, bookkeeping, launches), fitted to the
#   published speed-ups (results.csv, which give acceptance length and k). spec_seq_overhead_s
#   (per sequence per speculative step) is set from the engine's structure, not fitted: SGLang
#   turns its overlap scheduler off for EAGLE, so the per-request host work runs in series
#   (50 us; spectool.predict.loso.SEQ_PRIOR says where that comes from).
# * the eager HF research code (spectool.predict.published.EXTRA_ENGINES) has no baseline rows
#   and fits its overheads on its speed-ups alone.
# Out-of-sample error and the prediction intervals: spectool.predict.interval and the README.
ENGINE_DEFAULTS: dict[str, EngineFactors] = {
    "trtllm": EngineFactors(
        bw_fraction=0.85,
        flops_fraction=0.6,
        step_overhead_s=0.4e-3,
        forward_overhead_s=20e-6,
        layer_overhead_s=100e-6,
        spec_overhead_s=0.0,
        draft_step_overhead_s=0.3e-3,
        source="engine default (trtllm): 85% HBM, 60% peak, 0.4 ms/step, 100 us/layer, "
        "0.3 ms/draft step",
    ),
    "vllm": EngineFactors(
        bw_fraction=0.7,
        flops_fraction=0.6,
        step_overhead_s=1e-3,
        forward_overhead_s=20e-6,
        layer_overhead_s=0.0,
        spec_overhead_s=0.0,
        draft_step_overhead_s=0.3e-3,
        source="engine default (vllm): 70% HBM, 60% peak, 1 ms/step, 0.3 ms/draft step",
    ),
    "sglang": EngineFactors(
        bw_fraction=1.0,
        flops_fraction=0.6,
        step_overhead_s=0.7e-3,
        forward_overhead_s=20e-6,
        layer_overhead_s=50e-6,
        spec_overhead_s=5e-3,
        draft_step_overhead_s=0.1e-3,
        spec_seq_overhead_s=50e-6,
        source="engine default (sglang): 100% HBM, 60% peak, 0.7 ms/step, 50 us/layer, "
        "5 ms/spec step + 50 us/sequence, 0.1 ms/draft step",
    ),
    # The embedded engine on CPU: no defaults worth the name (CPUs differ by 10x); these are
    # what the probe measured on a shared 2-core x86 box and only a fallback. Use probe.py.
    "torch-cpu": EngineFactors(
        bw_fraction=1.0,
        flops_fraction=1.0,
        step_overhead_s=0.0,
        forward_overhead_s=0.1e-3,
        layer_overhead_s=0.2e-3,
        seq_overhead_s=20e-6,
        spec_overhead_s=0.1e-3,
        spec_seq_overhead_s=30e-6,
        overlap=False,
        source="engine default (torch-cpu): fallback, run the CPU probe",
    ),
}
ENGINES: tuple[str, ...] = tuple(ENGINE_DEFAULTS)


@dataclass(frozen=True)
class StepCost:
    """One forward's predicted time (seconds) and what it is made of."""

    seconds: float
    weight_bytes: float
    kv_bytes: float
    flops: float
    memory_s: float
    compute_s: float
    overhead_s: float
    allreduce_s: float
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


def overhead_s(geom: Geometry, f: EngineFactors, tokens: int, sequences: float) -> float:
    """A forward's time outside the roofline: launches per forward and per layer (more for a
    multi-token verify), per MoE layer, and per sequence (once and per layer)."""
    per_layer = f.layer_overhead_s + (f.multi_token_layer_s if tokens > 1 else 0.0)
    return (
        f.forward_overhead_s
        + (f.multi_token_forward_s if tokens > 1 else 0.0)
        + geom.num_layers * per_layer
        + geom.moe_layers * f.moe_layer_overhead_s
        + sequences * (f.seq_overhead_s + geom.num_layers * f.seq_layer_overhead_s)
    )


def forward_cost(
    geom: Geometry,
    hw: Hardware,
    f: EngineFactors,
    batch: float,
    tokens: float,
    context: float,
    tp: int = 1,
) -> StepCost:
    """Predicted time of one forward of ``geom`` for ``batch`` sequences of ``tokens`` new tokens
    each, attending over ``context`` tokens; see the module docstring for the formula."""
    n = batch * tokens
    expert_params = geom.moe_layers * geom.distinct_experts(n) * geom.expert_params
    weight_bytes = (geom.dense_params + expert_params) * geom.weight_bytes_per_param / tp
    kv_bytes = batch * context * geom.kv_bytes_per_token / (1 if geom.kv_latent else tp)
    attn_flops = 4.0 * geom.num_layers * geom.num_attention_heads * geom.head_dim * context
    flops = (2.0 * geom.active_params + attn_flops) * n / tp
    memory_s = (weight_bytes + kv_bytes) / (hw.bandwidth * f.bw_fraction)
    compute_s = flops / (hw.flops_for(geom.weight_bytes_per_param) * f.flops_fraction)
    roof = max(memory_s, compute_s) if f.overlap else memory_s + compute_s
    overhead = overhead_s(geom, f, tokens, batch)
    allreduce = 0.0
    if tp > 1:
        per = f.allreduce_s + n * geom.hidden_size * 2 / (hw.link_bandwidth * f.link_fraction)
        allreduce = 2 * geom.num_layers * per
    return StepCost(
        seconds=roof + overhead + allreduce,
        weight_bytes=weight_bytes,
        kv_bytes=kv_bytes,
        flops=flops,
        memory_s=memory_s,
        compute_s=compute_s,
        overhead_s=overhead,
        allreduce_s=allreduce,
    )
