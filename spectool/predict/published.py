"""Published speculative-decoding results as a check of the step-cost model.

Reads a folder holding ``results.csv`` (one published measurement a row) and ``models.yaml``
(the geometry of every model and drafter the rows name), the schema of
``tests/data/published/`` (see its ``SOURCES.md``), and predicts each usable row's speed-up
from the row's own acceptance length, with engine-level default factors only
(:data:`~spectool.predict.cost.ENGINE_DEFAULTS` plus :data:`EXTRA_ENGINES`): nothing is fitted
per row. Rows without an acceptance length, a concurrency or a draft length are skipped, with
the reason.
"""

from __future__ import annotations

import csv
import functools
import math
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from spectool.decide.chain import constant_alpha_for
from spectool.errors import BadInputError
from spectool.predict.cost import ENGINE_DEFAULTS, EngineFactors, Hardware
from spectool.predict.geometry import DTYPE_BYTES, Geometry
from spectool.predict.model import DRAFTER_GEOMETRY_METHODS, Setup

# Engines the table has that spectool does not deploy: Hugging Face transformers' eager
# generate() (the research code of Spec-Bench and the EAGLE papers): no CUDA graphs, Python
# dispatch of every kernel. Overheads fitted like ENGINE_DEFAULTS' (see there).
EXTRA_ENGINES: dict[str, EngineFactors] = {
    "hf": EngineFactors(
        bw_fraction=0.75,
        flops_fraction=0.6,
        step_overhead_s=5e-3,
        forward_overhead_s=20e-6,
        layer_overhead_s=10e-6,
        spec_overhead_s=3e-3,
        source="engine default (hf eager): 75% HBM, 60% peak, 5 ms/step, 3 ms/spec step",
    ),
}

# Mean context per sequence during decode when a row gives no input/output lengths (MT-bench
# style chat: a prompt of a few hundred tokens, answers of a few hundred).
DEFAULT_CONTEXT = 512

# ``load_kind`` of a row whose ``concurrency`` is the number of client threads working through a
# finite prompt set, its throughput the whole run's output tokens over its wall time (SpecForge
# ``benchmarks/bench_eagle3.py``: ``sgl_function.run_batch(questions, num_threads=batch_size)``
# timed as one ``latency``, ``output_throughput = num_output_tokens / latency``, in
# ``benchmarks/benchmarker/{base,utils}.py`` @dc44caf1, 2025-12-08). The threads run out of
# prompts at different times, and a thread's next two-turn conversation waits for its last, so
# the decode batch averages below ``concurrency``; see :func:`effective_batch`.
CLOSED_SET = "closed-set"
_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp4": "nvfp4"}


@dataclass(frozen=True)
class PublishedRow:
    """One row of ``results.csv``, the fields the model reads."""

    row_id: str
    source_id: str
    model: str
    drafter: str | None
    method: str
    drafting: str
    draft_len: int | None
    engine: str
    gpu: str
    tp: int
    precision: str
    concurrency: int | None
    acceptance_length: float | None
    speedup: float
    input_len: int | None
    output_len: int | None
    verify_tokens: int | None  # tree drafting: tokens verified per sequence (SGLang's n)
    topk: int  # tree drafting: branches expanded per draft step
    # notes' ``ref_acceptance_length=``: measured in ANOTHER run (same drafter and k), only for
    # trend checks of rows that publish no acceptance length of their own
    ref_acceptance_length: float | None = None
    load_kind: str = "batch"
    baseline_value: float | None = None  # the source's speed without speculation, if given
    # closed-set rows: baseline_value over the same source's at concurrency 1 (see
    # effective_batch); None for other rows and where the source has no concurrency 1
    baseline_scale: float | None = None


def _int(value: str) -> int | None:
    return int(float(value)) if value.strip() else None


def _float(value: str) -> float | None:
    return float(value) if value.strip() else None


def read_csv_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV table with a header line; an unreadable file is a BadInputError."""
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            return list(csv.DictReader(fh))
    except OSError as exc:
        raise BadInputError(path, f"cannot read: {exc}") from exc


def load_rows(folder: Path) -> list[PublishedRow]:
    """Every row of ``folder/results.csv``; errors name the file and the row."""
    path = folder / "results.csv"
    raw = read_csv_rows(path)
    rows = []
    for i, r in enumerate(raw, start=2):
        try:
            notes = r.get("notes", "")
            n = re.search(r"num_draft_tokens=(\d+)", notes)
            topk = re.search(r"topk=(\d+)", notes)
            ref = re.search(r"ref_acceptance_length=([0-9.]+\d)", notes)
            rows.append(
                PublishedRow(
                    row_id=r["row_id"],
                    source_id=r["source_id"],
                    model=r["model"],
                    drafter=r["drafter"] or None,
                    method=r["method"],
                    drafting=r["drafting"],
                    draft_len=_int(r["draft_len"]),
                    engine=r["engine"],
                    gpu=r["gpu"],
                    tp=_int(r["tp"]) or 1,
                    precision=r["precision"],
                    concurrency=_int(r["concurrency"]),
                    acceptance_length=_float(r["acceptance_length"]),
                    speedup=float(r["speedup"]),
                    input_len=_int(r["input_len"]),
                    output_len=_int(r["output_len"]),
                    verify_tokens=int(n.group(1)) if n else None,
                    topk=int(topk.group(1)) if topk else 1,
                    ref_acceptance_length=float(ref.group(1)) if ref else None,
                    load_kind=r["load_kind"],
                    baseline_value=_float(r["baseline_value"]),
                )
            )
        except (KeyError, ValueError) as exc:
            raise BadInputError(path, f"line {i}: {exc}") from exc
    return _with_baseline_scales(path, rows)


def _with_baseline_scales(path: Path, rows: list[PublishedRow]) -> list[PublishedRow]:
    """Closed-set rows with their :attr:`PublishedRow.baseline_scale`: the baseline value at
    the row's concurrency over the same source's baseline at concurrency 1 (same model, GPU,
    TP and engine). Baselines at concurrency 1 that disagree are an error: they are one run."""

    def key(row: PublishedRow) -> tuple[str, ...]:
        return (row.source_id, row.model, row.gpu, str(row.tp), row.engine)

    ones: dict[tuple[str, ...], float] = {}
    for row in rows:
        base = row.baseline_value
        if row.load_kind != CLOSED_SET or row.concurrency != 1 or base is None:
            continue
        if key(row) in ones and not math.isclose(ones[key(row)], base, rel_tol=0.005):
            raise BadInputError(
                path, f"{row.row_id}: batch-1 baseline {base} differs from {ones[key(row)]}"
            )
        ones.setdefault(key(row), base)
    return [
        replace(row, baseline_scale=row.baseline_value / ones[key(row)])
        if row.load_kind == CLOSED_SET and row.baseline_value is not None and key(row) in ones
        else row
        for row in rows
    ]


def load_models(folder: Path) -> dict[str, dict[str, Any]]:
    path = folder / "models.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise BadInputError(path, f"cannot read: {' '.join(str(exc).split())}") from exc
    if not isinstance(data, dict):
        raise BadInputError(path, "expected a mapping of model keys")
    return data


def geometry_from_published(entry: Mapping[str, Any], name: str, precision: str) -> Geometry:
    """A :class:`Geometry` from one ``models.yaml`` entry (HF config field names)."""
    try:
        hidden = int(entry["hidden_size"])
        layers = int(entry["num_hidden_layers"])
        heads = int(entry["num_attention_heads"])
        kv_heads = int(entry["num_key_value_heads"])
        head_dim = int(entry["head_dim"])
        inter = int(entry["intermediate_size"])
        vocab = int(entry.get("draft_vocab_size") or entry["vocab_size"])
        kind = str(entry["kind"])
        tied = bool(entry["tie_word_embeddings"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInputError(f"models.yaml: {name}", f"missing or bad field {exc}") from exc
    dtype = _PRECISION.get(precision, "bf16")
    wbytes = DTYPE_BYTES[dtype]
    kv_elem = 1.0 if wbytes < 2 else 2.0  # fp8/fp4 deployments keep an fp8 KV cache
    head = float(vocab * hidden)
    q_in = 2 * hidden if kind == "eagle3_head" else hidden  # EAGLE-3: [embeds, fused hidden]
    if entry.get("attention") == "mla":
        q_lora, kv_lora = int(entry["q_lora_rank"]), int(entry["kv_lora_rank"])
        nope, rope = int(entry["qk_nope_head_dim"]), int(entry["qk_rope_head_dim"])
        v_dim = int(entry["v_head_dim"])
        attn = (
            hidden * q_lora
            + q_lora * heads * (nope + rope)
            + hidden * (kv_lora + rope)
            + kv_lora * heads * (nope + v_dim)
            + heads * v_dim * hidden
        )
        kv = layers * (kv_lora + rope) * kv_elem
    else:
        attn = q_in * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
        kv = 2 * layers * kv_heads * head_dim * kv_elem
    experts = int(entry.get("num_experts") or 0)
    if experts:
        moe_inter = int(entry["moe_intermediate_size"])
        dense_layers = int(entry.get("first_k_dense_layers") or 0)
        moe_layers = layers - dense_layers
        expert = 3.0 * hidden * moe_inter
        shared = int(entry.get("shared_experts") or 0) * expert
        dense = layers * attn + dense_layers * 3.0 * hidden * inter + moe_layers * shared + head
        top_k = int(entry["experts_per_token"])
    else:
        moe_layers, expert, top_k = 0, 0.0, 0
        # gated MLPs (SwiGLU: gate, up, down) unless the entry says 2 (GPT-J: fc_in, fc_out)
        mlp = int(entry.get("mlp_matrices") or 3)
        dense = layers * (attn + mlp * hidden * inter) + head
    if kind in ("eagle3_head", "eagle_head"):
        dense += (3 if kind == "eagle3_head" else 2) * hidden * hidden  # fc
    return Geometry(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        head_dim=head_dim,
        dense_params=dense,
        lm_head_params=head,
        kv_bytes_per_token=kv,
        weight_bytes_per_param=wbytes,
        expert_params=expert,
        num_experts=experts,
        experts_per_token=top_k,
        moe_layers=moe_layers,
        # the input table: none of its own when tied or an EAGLE-3 head (it reads the target's)
        embedding_params=0.0
        if tied or kind == "eagle3_head"
        else float(entry["vocab_size"]) * hidden,
        num_kv_heads=kv_heads,
        kv_latent=entry.get("attention") == "mla",
        mtp_layers=int(entry.get("num_nextn_predict_layers") or 0),
    )


@functools.lru_cache(maxsize=64)
def hardware_for(gpu: str) -> Hardware:
    """The row's GPU from spectool's GPU profiles (unknown names: one-line ProfileError)."""
    from spectool.profiles import load_gpu

    return Hardware.from_gpu(load_gpu(gpu), gpu)


def engine_factors(engine: str) -> EngineFactors:
    if engine in EXTRA_ENGINES:
        return EXTRA_ENGINES[engine]
    if engine not in ENGINE_DEFAULTS:
        raise BadInputError("results.csv", f"engine {engine!r} has no default factors")
    return ENGINE_DEFAULTS[engine]


def skip_reason(row: PublishedRow) -> str | None:
    """Why a row cannot be predicted from its own numbers, or None."""
    if row.acceptance_length is None:
        return "no acceptance length"
    if row.concurrency is None:
        return "no concurrency"
    if row.draft_len is None:
        return "no draft length"
    if row.drafting == "tree" and row.verify_tokens is None:
        return "tree without its size"
    if row.drafting == "chain" and row.acceptance_length > row.draft_len + 1:
        return "acceptance length above k + 1"
    if row.load_kind == CLOSED_SET and row.concurrency != 1 and row.baseline_scale is None:
        return "closed-set row without the source's baseline at concurrency 1"
    return None


def effective_batch(setup: Setup, concurrency: float, baseline_scale: float) -> float:
    """The decode batch a closed-set row ran at on average: the batch b in [1, concurrency] at
    which the model's baseline throughput gains over batch 1 what the source's own baseline
    did (``baseline_scale``), i.e. ``b * t(1) / t(b) = baseline_scale``. Only the source's
    baseline (no-speculation) values enter, never its speculative ones. A source that scaled
    as well as a steady batch of ``concurrency`` gets ``concurrency`` back; one that did not
    scale at all gets 1."""
    t1 = setup.base_step(1)

    def gain(b: float) -> float:
        return b * t1 / setup.base_step(b)

    if baseline_scale >= gain(concurrency):
        return float(concurrency)
    lo, hi = 1.0, float(concurrency)
    if baseline_scale <= gain(lo):
        return lo
    while hi / lo > 1.0 + 1e-9:  # gain rises with b (step time grows slower than the batch)
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if gain(mid) < baseline_scale else (lo, mid)
    return math.sqrt(lo * hi)


def row_setup(
    row: PublishedRow,
    models: Mapping[str, Mapping[str, Any]],
    factors: Mapping[str, EngineFactors] | None = None,
) -> Setup:
    """The step-cost setup of one row: its models' geometry, its GPU, its TP, its engine's
    factors (``factors`` overriding the defaults) and its context (:data:`DEFAULT_CONTEXT`
    when it gives no lengths)."""
    target = geometry_from_published(models[row.model], row.model, row.precision)
    drafter = (
        geometry_from_published(models[row.drafter], row.drafter, row.precision)
        if row.drafter
        else None
    )
    f = (factors or {}).get(row.engine) or engine_factors(row.engine)
    context = (
        (row.input_len or 0) + (row.output_len or 0) // 2
        if row.input_len or row.output_len
        else DEFAULT_CONTEXT
    )
    method = {"eagle2": "eagle"}.get(row.method, row.method)
    return Setup(
        target=target,
        method=method,
        hardware=hardware_for(row.gpu),
        factors=f,
        drafter=drafter if method in DRAFTER_GEOMETRY_METHODS else None,
        tp=row.tp,
        context=context,
    )


def predict_row(
    row: PublishedRow,
    models: Mapping[str, Mapping[str, Any]],
    factors: Mapping[str, EngineFactors] | None = None,
) -> float:
    """Predicted speed-up of one usable row (see :func:`skip_reason`), from its published
    acceptance length, its models' geometry, its GPU and its engine's default factors."""
    reason = skip_reason(row)
    if reason:
        raise BadInputError(row.row_id, f"cannot predict: {reason}")
    assert row.acceptance_length is not None
    assert row.concurrency is not None
    assert row.draft_len is not None
    setup = row_setup(row, models, factors)
    k, length = row.draft_len, row.acceptance_length
    c: float = row.concurrency
    if row.load_kind == CLOSED_SET and row.baseline_scale is not None:
        c = effective_batch(setup, c, row.baseline_scale)
    base = setup.base_step(c)
    if row.drafting == "tree":
        assert row.verify_tokens is not None
        spec = (
            setup.draft_time(c * row.topk, k, length, 0.0)
            + setup.target_step(c, row.verify_tokens)
            + setup.coord_time(c)
        )
    else:
        p_all = constant_alpha_for(length, k, row.row_id) ** k
        spec = setup.spec_step(c, k, length, p_all)
    return base * length / spec


def predict_with_reference(
    row: PublishedRow,
    models: Mapping[str, Mapping[str, Any]],
    factors: Mapping[str, EngineFactors] | None = None,
) -> float:
    """:func:`predict_row` of a row that publishes no acceptance length, from the reference
    one in its notes (another run): for trends over batch only, never in the accuracy figures
    or the fit."""
    if row.ref_acceptance_length is None:
        raise BadInputError(row.row_id, "cannot predict: no reference acceptance length")
    return predict_row(replace(row, acceptance_length=row.ref_acceptance_length), models, factors)


@dataclass(frozen=True)
class Evaluation:
    """Predicted against published speed-up for every usable row."""

    rows: tuple[tuple[PublishedRow, float], ...]

    @property
    def errors(self) -> list[float]:
        return [p / r.speedup - 1.0 for r, p in self.rows]

    @property
    def median_abs_error(self) -> float:
        return statistics.median(abs(e) for e in self.errors)

    def wrong_side(
        self, band: tuple[float, float] = (0.9, 1.1)
    ) -> list[tuple[PublishedRow, float]]:
        """Rows published outside ``band`` whose prediction falls on the other side of 1."""
        lo, hi = band
        return [
            (r, p)
            for r, p in self.rows
            if not lo <= r.speedup <= hi and (p > 1.0) != (r.speedup > 1.0)
        ]


def usable(rows: list[PublishedRow]) -> list[PublishedRow]:
    return [r for r in rows if skip_reason(r) is None]


def evaluate(
    rows: list[PublishedRow],
    models: Mapping[str, Mapping[str, Any]],
    factors: Mapping[str, EngineFactors] | None = None,
) -> Evaluation:
    return Evaluation(tuple((r, predict_row(r, models, factors)) for r in usable(rows)))
