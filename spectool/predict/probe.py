"""CPU probe: measure this machine so the step-cost model predicts spectool's embedded engine.

A few seconds of micro-measurements, none of them a decode of the model being predicted:

1. memory bandwidth, reading a buffer the size of the model's weights (cache effects included:
   a 20 MB model on a big L3 reads faster than DRAM);
2. the engine's decoder layer at the model's shapes, with random float16-exact weights (so the
   same fbgemm kernel runs), built with 1 and with 5 layers: the difference is the time of one
   layer, fitted over (batch b, tokens t) as ``a + (b t) c + b s`` plus ``m`` when a call
   carries more than one token per sequence (the attention-mask path): ``c`` gives the FLOP
   rate at these shapes, ``a`` the per-layer overhead (its weight reads taken off at the
   measured bandwidth), ``s`` the per-sequence cost (KV gather and attention, its KV bytes taken
   off), ``m`` the per-layer cost of a multi-token (verify / catch-up) forward;
3. what a forward costs besides its layers (embedding, final norm, LM head, masks): the 1-layer
   model minus one layer, the LM head's FLOPs taken off;
4. the host's per-sequence work per step (arg-max over the vocabulary, token bookkeeping).

torch is imported lazily here and nowhere else in :mod:`spectool.predict`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from spectool.predict.cost import EngineFactors, Hardware
from spectool.predict.geometry import Geometry

# (batch, tokens per sequence) points the layer is timed at.
# The deep probe model's layer count (the shallow one has 1): the difference is DEEP - 1 layers.
DEEP = 5
GRID: tuple[tuple[int, int], ...] = (
    (1, 1),
    (2, 1),
    (4, 1),
    (8, 1),
    (1, 2),
    (1, 3),
    (1, 5),
    (4, 2),
    (4, 3),
    (8, 2),
    (8, 5),
)


@dataclass(frozen=True)
class ProbeResult:
    """What the probe measured, and the factors it implies for :func:`forward_cost`."""

    hardware: Hardware
    factors: EngineFactors
    layer_ms: dict[tuple[int, int], float]
    seconds: float

    def describe(self) -> str:
        f = self.factors
        return (
            f"bandwidth {self.hardware.bandwidth / 1e9:.1f} GB/s, matmul "
            f"{self.hardware.flops16 / 1e9:.1f} GFLOP/s, layer overhead "
            f"{f.layer_overhead_s * 1e6:.0f} us (+{f.multi_token_layer_s * 1e6:.0f} us "
            f"multi-token), forward overhead {f.forward_overhead_s * 1e6:.0f} us "
            f"(+{f.multi_token_forward_s * 1e6:.0f} us multi-token), per sequence "
            f"{f.seq_overhead_s * 1e6:.0f} us + {f.seq_layer_overhead_s * 1e6:.1f} us per layer; "
            f"probe took {self.seconds:.1f} s"
        )


def _best_time(fn: Callable[[], object], repeats: int, inner: int = 1) -> float:
    """Fastest of ``repeats`` timings of ``inner`` calls, per call, seconds (on a shared machine
    noise only adds time, so the minimum is the machine's own speed)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def _lstsq(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares by the normal equations (a handful of unknowns, pure Python)."""
    n = len(rows[0])
    m = [
        [sum(r[i] * r[j] for r in rows) for j in range(n)]
        + [sum(r[i] * y for r, y in zip(rows, ys, strict=True))]
        for i in range(n)
    ]
    for col in range(n):  # Gauss-Jordan with partial pivoting
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        if abs(m[col][col]) < 1e-30:
            continue
        for r in range(n):
            if r != col:
                fac = m[r][col] / m[col][col]
                m[r] = [x - fac * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] if abs(m[i][i]) > 1e-30 else 0.0 for i in range(n)]


def probe_cpu(
    geom: Geometry,
    *,
    intermediate_size: int,
    num_kv_heads: int,
    vocab_size: int,
    context: int = 128,
    repeats: int = 10,
    passes: int = 3,
    threads: int | None = 1,
) -> ProbeResult:
    """Measure this CPU at ``geom``'s shapes (the engine's float32 compute with float16-packed
    weights); returns hardware figures and torch-cpu :class:`EngineFactors` for it.

    ``threads``: torch threads while probing (the engine's setting; restored afterwards).
    """
    import torch

    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _probe(geom, intermediate_size, num_kv_heads, vocab_size, context, repeats, passes)
    finally:
        torch.set_num_threads(previous)


def _probe(
    geom: Geometry,
    intermediate_size: int,
    num_kv_heads: int,
    vocab_size: int,
    context: int,
    repeats: int,
    passes: int,
) -> ProbeResult:
    import torch

    from spectool.engine.model import ModelArgs, Transformer

    start = time.perf_counter()
    gen = torch.Generator().manual_seed(0)

    # 1. bandwidth at the model's working-set size
    n_floats = max(1 << 20, int(geom.dense_params * geom.weight_bytes_per_param / 4))
    buf = torch.rand(n_floats, generator=gen)
    read_s = _best_time(lambda: buf.sum(), repeats)
    bandwidth = n_floats * 4 / read_s

    def build(layers: int) -> Transformer:
        args = ModelArgs(
            model_type="llama",
            dim=geom.hidden_size,
            n_layers=layers,
            n_heads=geom.num_attention_heads,
            n_kv_heads=num_kv_heads,
            head_dim=geom.head_dim,
            intermediate_size=intermediate_size,
            vocab_size=vocab_size,
            max_position_embeddings=context + 16,
        )
        model = Transformer(args)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_((torch.randn(p.shape, generator=gen) * 0.02).half().float())
        model.pack_fp16_weights()
        model.setup_rope(context + 16)
        return model.eval()

    models = {n: build(n) for n in (1, DEEP)}
    caches = {n: m.new_cache(8, context + 16) for n, m in models.items()}

    def call(n_layers: int, batch: int, tokens: int) -> Callable[[], object]:
        model, cache = models[n_layers], caches[n_layers]
        start_pos = context - tokens
        tok = torch.randint(2, vocab_size, (batch, tokens), generator=gen)
        pos = torch.arange(start_pos, context)[None, :].expand(batch, tokens).contiguous()
        slots = torch.arange(batch)

        def forward() -> object:
            for s in range(batch):
                cache.set_length(s, start_pos)
            return model(tok, pos, cache, slots)

        return forward

    layer_ms: dict[tuple[int, int], float] = {}
    rest: list[tuple[int, bool, float]] = []
    best = {(g, n): float("inf") for g in GRID for n in (1, DEEP)}
    with torch.inference_mode():
        # Shallow and deep calls alternate, so both see the same load; the grid is swept
        # ``passes`` times (a burst of load from elsewhere lasts a while); the fastest of each.
        for _ in range(passes):
            for g in GRID:
                fns = {1: call(1, *g), DEEP: call(DEEP, *g)}
                fns[1](), fns[DEEP]()
                for _ in range(repeats):
                    for n_layers, fn in fns.items():
                        t0 = time.perf_counter()
                        fn()
                        best[(g, n_layers)] = min(best[(g, n_layers)], time.perf_counter() - t0)
        for g in GRID:
            batch, tokens = g
            per_layer = max((best[(g, DEEP)] - best[(g, 1)]) / (DEEP - 1), 1e-7)
            layer_ms[g] = per_layer * 1e3
            rest.append((batch * tokens, tokens > 1, best[(g, 1)] - per_layer))
    # 2. per layer: fitted by least squares on the fastest timings
    # per layer: a + c (tokens) + s (sequences: each one's KV gather and attention) + m [t > 1]
    a, c, seq, m = _lstsq(
        [[1.0, float(b * t), float(b), 1.0 if t > 1 else 0.0] for b, t in GRID],
        [layer_ms[g] / 1e3 for g in GRID],
    )
    c = max(c, 1e-12)
    layer_params = (geom.dense_params - geom.lm_head_params) / geom.num_layers
    flops = 2 * layer_params / c
    layer_overhead = max(0.0, a - layer_params * geom.weight_bytes_per_param / bandwidth)
    kv_layer_bytes = geom.kv_bytes_per_token / geom.num_layers
    # 3. the rest of a forward: embedding, norm, LM head (its FLOPs at the same rate)
    lm_flops = 2 * geom.lm_head_params
    lm_bytes = geom.lm_head_params * geom.weight_bytes_per_param
    left = [(n, multi, r - n * lm_flops / flops - lm_bytes / bandwidth) for n, multi, r in rest]
    forward_fixed = statistics.median(r for _, multi, r in left if not multi)
    multi_forward = statistics.median(r for _, multi, r in left if multi) - forward_fixed

    # 4. host work per sequence: arg-max over the vocabulary and a list of ids
    def argmax(n: int) -> Callable[[], object]:
        logits = torch.randn(n, vocab_size, generator=gen)
        return lambda: logits.argmax(-1).tolist()

    t1, t16 = _best_time(argmax(1), repeats, 5), _best_time(argmax(16), repeats, 5)
    per_seq = max(0.0, (t16 - t1) / 15)
    hardware = Hardware(name="this CPU (probe)", bandwidth=bandwidth, flops16=flops)
    factors = EngineFactors(
        bw_fraction=1.0,
        flops_fraction=1.0,
        step_overhead_s=0.0,
        forward_overhead_s=max(0.0, forward_fixed) + t1,
        multi_token_forward_s=max(0.0, multi_forward),
        layer_overhead_s=layer_overhead,
        multi_token_layer_s=max(0.0, m),
        # the KV bytes of a sequence's context are already in forward_cost's memory term
        seq_layer_overhead_s=max(0.0, seq - context * kv_layer_bytes / bandwidth),
        seq_overhead_s=per_seq,
        spec_overhead_s=t1,
        spec_seq_overhead_s=per_seq,
        overlap=False,
        source="CPU probe (spectool.predict.probe)",
    )
    return ProbeResult(hardware, factors, layer_ms, time.perf_counter() - start)
