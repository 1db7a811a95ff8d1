"""Will target + drafter fit on this GPU, and what does the drafter cost in KV capacity?

An estimate from header shapes and dtypes (quantisation honoured: an FP8 checkpoint's weights
count one byte per element), per GPU after tensor parallelism:

    budget_kv = (memory - weights/tp - reserve) * kv_fraction
    sequences = budget_kv // (kv_bytes_per_token * max_seq_len)

KV bytes per token = layers x 2 (K and V) x kv_heads/tp x head_dim x kv dtype bytes; multi-head
latent attention (DeepSeek) keeps one latent of kv_lora_rank + qk_rope_head_dim per layer and is
not split by TP. With speculation each sequence also reserves ``max_draft_len`` extra KV slots in
the target cache, and the drafter adds its weights and its own KV cache (EAGLE heads and MTP
layers: their few layers; a draft model: all of its layers; n-gram: nothing).

The reserve covers the CUDA context, activations and CUDA graphs: 1 GiB + 200 MB per captured
graph batch size (TensorRT-LLM's own figure per graph) + activation memory for max_num_tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from spectool import methods
from spectool.ckpt.inspect import Checkpoint
from spectool.findings import Finding, error, warning

GIB = 1024**3
# TensorRT-LLM's default share of free memory given to the KV cache.
KV_CACHE_FRACTION = 0.9
CUDA_CONTEXT_BYTES = 1 * GIB
CUDA_GRAPH_BYTES = 200 * 1024**2
DEFAULT_GRAPH_BATCH_SIZES = 8
MEMORY_PRESSURE_SHARE = 0.10

_KV_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "fp8": 1}


def kv_bytes_per_token(ckpt: Checkpoint, layers: int | None = None, tp: int = 1) -> int:
    """KV cache bytes one token costs in ``ckpt``'s attention layers, per GPU."""
    n_layers = ckpt.num_layers if layers is None else layers
    if not n_layers:
        return 0
    dtype_bytes = _kv_dtype_bytes(ckpt)
    if ckpt.kv_lora_rank:
        rope = ckpt.text_config.get("qk_rope_head_dim") or 0
        return int(n_layers * (ckpt.kv_lora_rank + int(rope)) * dtype_bytes)
    kv_heads = max(1, (ckpt.num_kv_heads or 1) // tp)
    return int(n_layers * 2 * kv_heads * (ckpt.head_dim or 0) * dtype_bytes)


def _kv_dtype_bytes(ckpt: Checkpoint) -> int:
    quant = ckpt.config.get("quantization_config")
    if isinstance(quant, dict):
        kv_algo = str(
            quant.get("kv_cache_quant_algo") or quant.get("kv_cache_scheme") or ""
        ).lower()
        if "fp8" in kv_algo or "int8" in kv_algo:
            return 1
    dtype = ckpt.config_dtype or "bfloat16"
    return _KV_DTYPE_BYTES.get(dtype, 2)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU. ``sequences_*``: how many sequences of ``max_seq_len`` the KV cache holds."""

    gpu: str
    gpu_memory_bytes: int
    tp: int
    max_seq_len: int
    max_draft_len: int
    target_weight_bytes: int
    drafter_weight_bytes: int
    reserve_bytes: int
    target_kv_bytes_per_token: int
    drafter_kv_bytes_per_token: int
    kv_budget_without_drafter_bytes: int
    kv_budget_with_drafter_bytes: int
    sequences_without_drafter: int
    sequences_with_drafter: int
    # A parallel layout (spectool.memory_ranks): the layout, and one row per pipeline stage; the
    # fields above are then the tightest stage's.
    layout: dict[str, Any] | None = None
    per_rank: tuple[dict[str, Any], ...] = ()

    @property
    def drafter_share_of_kv(self) -> float:
        """The fraction of baseline KV capacity (in sequences) that speculation costs."""
        if self.sequences_without_drafter <= 0:
            return 0.0
        lost = self.sequences_without_drafter - self.sequences_with_drafter
        return lost / self.sequences_without_drafter

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["drafter_share_of_kv"] = round(self.drafter_share_of_kv, 4)
        return d


def drafter_footprint(
    target: Checkpoint, drafter: Checkpoint | None, method: str, tp: int
) -> tuple[int, int]:
    """(weight bytes, KV bytes per token) the drafter adds, per GPU."""
    kind = methods.get(method).drafter_memory
    if kind == "none":
        return 0, 0
    if kind == "native_layers_kv":
        n = target.mtp_layers or 1
        # MTP weights are already part of the target's weights; only their KV is extra.
        return 0, kv_bytes_per_token(target, layers=n, tp=tp)
    if drafter is None:
        return 0, 0
    weights = drafter.weight_bytes // tp
    if kind == "model":
        return weights, kv_bytes_per_token(drafter, tp=tp)
    # EAGLE / Medusa heads: their own few layers (Medusa keeps no KV cache).
    layers = 0 if kind == "head_no_kv" else (drafter.num_layers or 1)
    kv_source = drafter if drafter.head_dim and drafter.num_kv_heads else target
    return weights, kv_bytes_per_token(kv_source, layers=layers, tp=tp)


def estimate_memory(
    target: Checkpoint,
    drafter: Checkpoint | None,
    method: str,
    *,
    gpu_name: str,
    gpu_memory_bytes: int,
    tp: int = 1,
    max_seq_len: int = 8192,
    max_draft_len: int = 4,
    max_num_tokens: int = 8192,
    target_weight_bytes: int | None = None,
    target_kv_bytes_per_token: int | None = None,
    drafter_weight_bytes: int | None = None,
    drafter_kv_bytes_per_token: int | None = None,
) -> MemoryEstimate:
    """The estimate for one GPU; the ``*_bytes`` overrides give one rank's own amounts (a
    parallel layout, :mod:`spectool.memory_ranks`) instead of the whole model divided by TP."""
    target_weights = (
        target.weight_bytes // tp if target_weight_bytes is None else target_weight_bytes
    )
    t_kv = target_kv_bytes_per_token
    if t_kv is None:
        t_kv = kv_bytes_per_token(target, tp=tp)
    d_weights, d_kv = drafter_footprint(target, drafter, method, tp)
    if drafter_weight_bytes is not None:
        d_weights = drafter_weight_bytes
    if drafter_kv_bytes_per_token is not None:
        d_kv = drafter_kv_bytes_per_token
    return memory_budget(
        gpu_name=gpu_name,
        gpu_memory_bytes=gpu_memory_bytes,
        tp=tp,
        max_seq_len=max_seq_len,
        max_draft_len=max_draft_len,
        max_num_tokens=max_num_tokens,
        hidden_size=target.hidden_size or 0,
        target_weight_bytes=target_weights,
        target_kv_bytes_per_token=t_kv,
        drafter_weight_bytes=d_weights,
        drafter_kv_bytes_per_token=d_kv,
    )


def memory_budget(
    *,
    gpu_name: str,
    gpu_memory_bytes: int,
    tp: int,
    max_seq_len: int,
    max_draft_len: int,
    max_num_tokens: int = 8192,
    hidden_size: int,
    target_weight_bytes: int,
    target_kv_bytes_per_token: int,
    drafter_weight_bytes: int,
    drafter_kv_bytes_per_token: int,
) -> MemoryEstimate:
    """The estimate for one GPU from its own amounts (the module docstring's formula)."""
    target_weights, t_kv = target_weight_bytes, target_kv_bytes_per_token
    d_weights, d_kv = drafter_weight_bytes, drafter_kv_bytes_per_token
    activations = max_num_tokens * hidden_size * 2 * 8 // tp  # a few live [tokens, hidden] buffers
    reserve = CUDA_CONTEXT_BYTES + DEFAULT_GRAPH_BATCH_SIZES * CUDA_GRAPH_BYTES + activations
    free_base = max(0, gpu_memory_bytes - target_weights - reserve)
    free_spec = max(0, free_base - d_weights)
    budget_base = int(free_base * KV_CACHE_FRACTION)
    budget_spec = int(free_spec * KV_CACHE_FRACTION)
    per_seq_base = t_kv * max_seq_len
    spec_tokens = max_seq_len + max_draft_len  # draft slots reserved in the target cache
    per_seq_spec = t_kv * spec_tokens + d_kv * spec_tokens
    seq_base = budget_base // per_seq_base if per_seq_base else 0
    seq_spec = budget_spec // per_seq_spec if per_seq_spec else 0
    return MemoryEstimate(
        gpu=gpu_name,
        gpu_memory_bytes=gpu_memory_bytes,
        tp=tp,
        max_seq_len=max_seq_len,
        max_draft_len=max_draft_len,
        target_weight_bytes=target_weights,
        drafter_weight_bytes=d_weights,
        reserve_bytes=reserve,
        target_kv_bytes_per_token=t_kv,
        drafter_kv_bytes_per_token=d_kv,
        kv_budget_without_drafter_bytes=budget_base,
        kv_budget_with_drafter_bytes=budget_spec,
        sequences_without_drafter=int(seq_base),
        sequences_with_drafter=int(seq_spec),
    )


def memory_findings(est: MemoryEstimate, max_batch_size: int | None = None) -> list[Finding]:
    g = est.gpu_memory_bytes / GIB
    findings: list[Finding] = []
    if est.sequences_without_drafter < 1:
        findings.append(
            error(
                "MEMORY_BUDGET",
                f"target weights {est.target_weight_bytes / GIB:.1f} GiB per GPU + reserve "
                f"{est.reserve_bytes / GIB:.1f} GiB leave no room for one {est.max_seq_len}-token "
                f"sequence on {est.gpu} ({g:.0f} GiB, tp={est.tp})",
                "Use more GPUs (--tp), a quantised checkpoint, or a shorter --max-seq-len.",
            )
        )
    elif est.sequences_with_drafter < 1:
        findings.append(
            error(
                "MEMORY_BUDGET",
                f"with the drafter ({est.drafter_weight_bytes / GIB:.2f} GiB weights, "
                f"{est.drafter_kv_bytes_per_token} B/token KV) not one {est.max_seq_len}-token "
                f"sequence fits on {est.gpu} ({g:.0f} GiB, tp={est.tp})",
                "Use more GPUs (--tp), a smaller drafter, or a shorter --max-seq-len.",
            )
        )
    elif est.drafter_share_of_kv > MEMORY_PRESSURE_SHARE:
        findings.append(
            warning(
                "MEMORY_PRESSURE",
                f"the drafter costs {est.drafter_share_of_kv:.0%} of KV capacity: "
                f"{est.sequences_without_drafter} -> {est.sequences_with_drafter} sequences of "
                f"{est.max_seq_len} tokens on {est.gpu}",
                "Gains at high concurrency shrink; let spectool tune decide per concurrency.",
            )
        )
    if max_batch_size and 1 <= est.sequences_with_drafter < max_batch_size:
        findings.append(
            warning(
                "MEMORY_BATCH_LIMIT",
                f"only {est.sequences_with_drafter} sequences of {est.max_seq_len} tokens fit with "
                f"the drafter, below --max-batch-size {max_batch_size}",
                "Lower --max-batch-size or --max-seq-len, or add GPUs.",
            )
        )
    return findings
