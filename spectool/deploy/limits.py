"""The limits of a build, fitted to the GPU from the check's memory estimate.

Limits (PyTorch backend), from the memory estimate of the check
(:mod:`spectool.memory`, per GPU after TP, at ``max_seq_len``):

* ``max_batch_size`` = sequences that fit with the drafter, capped by ``--max-batch-size``
  (default cap :data:`DEFAULT_MAX_BATCH_CAP`, TensorRT-LLM's own default);
* ``max_num_tokens`` = max(8192, ``max_seq_len``, ``max_batch_size * (k + 1)``): a whole prompt
  fits one step, and so does a full batch of verify steps;
* ``cuda_graph_config.batch_sizes`` = powers of two up to min(``max_batch_size``, 128), that
  bound itself, and every concurrency of the decision (its schedule keys are added by the YAML
  renderer), so every draft-length switch lands on a captured graph;
* ``kv_cache_config.free_gpu_memory_fraction``: the KV cache takes this share of the memory free
  after loading, and CUDA graphs are captured from what is left, so the fraction leaves room for
  ``200 MB`` per graph plus :data:`KV_HEADROOM_BYTES`; at most 0.9 (TensorRT-LLM's default).

The embedded engine gets ``max_batch_size`` (capped by what fits, default
:data:`TORCH_DEFAULT_MAX_BATCH_SIZE`) and ``max_seq_len`` (at most the models' context).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spectool.deploy.decision import Decision
from spectool.deploy.manifest import LimitsRecord
from spectool.memory import (
    CUDA_GRAPH_BYTES,
    DEFAULT_GRAPH_BATCH_SIZES,
    GIB,
    KV_CACHE_FRACTION,
    MemoryEstimate,
)

if TYPE_CHECKING:
    from spectool.deploy.build_request import BuildInputs

DEFAULT_MAX_BATCH_CAP = 2048  # TensorRT-LLM's LlmArgs default max_batch_size
DEFAULT_MAX_NUM_TOKENS = 8192  # TensorRT-LLM's default; the memory estimate assumes it
CUDA_GRAPH_CAP = 128  # TensorRT-LLM's default largest CUDA-graph batch
KV_HEADROOM_BYTES = GIB // 2  # left free besides CUDA graphs (allocator slack, sampling buffers)
MIN_KV_FRACTION = 0.05
# The embedded engine's defaults (spectool serve --engine torch uses the same).
TORCH_DEFAULT_MAX_BATCH_SIZE = 32
TORCH_DEFAULT_MAX_SEQ_LEN = 1024


def kv_cache_fraction(memory: MemoryEstimate, graph_count: int) -> float:
    """Share of the memory free after loading to give the KV cache (module docstring), 2 dp."""
    free = memory.gpu_memory_bytes - memory.target_weight_bytes - memory.drafter_weight_bytes
    # The estimate's reserve holds context, activations and its default graph count; keep the
    # first two and count this build's graphs instead.
    free -= memory.reserve_bytes - DEFAULT_GRAPH_BATCH_SIZES * CUDA_GRAPH_BYTES
    if free <= 0:
        return MIN_KV_FRACTION
    keep = graph_count * CUDA_GRAPH_BYTES + KV_HEADROOM_BYTES
    fraction = min(KV_CACHE_FRACTION, 1.0 - keep / free)
    return max(MIN_KV_FRACTION, int(fraction * 100) / 100)


def graph_sizes(max_batch_size: int, decision: Decision | None) -> tuple[int, ...]:
    cap = min(max_batch_size, CUDA_GRAPH_CAP)
    sizes = {1 << i for i in range(cap.bit_length()) if 1 << i <= cap} | {cap}
    if decision is not None:
        sizes |= {c for c in decision.concurrencies if c <= max_batch_size}
    return tuple(sorted(sizes))


def fit_limits(inputs: BuildInputs) -> LimitsRecord:
    req, report = inputs.request, inputs.report
    memory = report.memory
    if req.engine == "torch":
        cap = req.max_batch_size or TORCH_DEFAULT_MAX_BATCH_SIZE
        fit = memory.sequences_with_drafter if memory is not None else cap
        max_seq_len = memory.max_seq_len if memory is not None else req.max_seq_len
        max_seq_len = max_seq_len or TORCH_DEFAULT_MAX_SEQ_LEN
        limit = report.target.max_position_embeddings
        if limit:
            max_seq_len = min(max_seq_len, limit)
        return LimitsRecord(max_batch_size=max(1, min(cap, fit)), max_seq_len=max_seq_len)
    assert memory is not None, "TensorRT-LLM builds always have a GPU"
    batch = max(1, min(memory.sequences_with_drafter, req.max_batch_size or DEFAULT_MAX_BATCH_CAP))
    tokens = max(DEFAULT_MAX_NUM_TOKENS, memory.max_seq_len, batch * (report.max_draft_len + 1))
    if req.trtllm_backend == "tensorrt":  # engine limits are build_config; no CUDA-graph keys
        return LimitsRecord(
            max_batch_size=batch, max_seq_len=memory.max_seq_len, max_num_tokens=tokens
        )
    sizes = graph_sizes(batch, inputs.decision)
    return LimitsRecord(
        max_batch_size=batch,
        max_seq_len=memory.max_seq_len,
        max_num_tokens=tokens,
        free_gpu_memory_fraction=kv_cache_fraction(memory, len(sizes) + 1),
        cuda_graph_batch_sizes=sizes,
        cuda_graph_padding=True,
    )
