"""Published absolute speeds of engines WITHOUT speculation: the baseline step-time check.

A speed-up is a ratio, and a model can get ratios right from wrong step times (25-30 % too
slow, issue 23). So the plain decode step is checked, and its engine factors fitted, against
published absolute throughput: ``baselines.csv`` in the folder of ``results.csv`` (schema in its
``SOURCES.md``). Two kinds of row:

* ``static``: TensorRT-LLM's ``gptSessionBenchmark`` (its performance tables, v0.5-v0.6): ``batch``
  prompts of ``input_len`` tokens prefilled together, then ``output_len`` decode steps; the value
  is output tokens per second per GPU. Predicted as ``batch x output_len / (prefill + output_len x
  decode step at the mean context) / tp``.
* ``single-stream``: one request at a time; the value is output tokens per second, i.e. one over
  the decode step (a short prompt's prefill is left in the source's figure, a few per cent).

``attention_kv`` says how the engine version that was measured read a grouped-query (GQA/MQA)
KV cache during decode: ``shared`` (each KV head read once for all the query heads of its group:
every current engine, TensorRT-LLM's XQA kernel) or ``per-query-head`` (once per query head, so
``heads / kv_heads`` times the bytes: TensorRT-LLM v0.5-v0.6's masked multi-head attention
before XQA; its XQA blog, "reducing data loading" for MQA/GQA, 2.4x Llama-70B throughput; its
Falcon-180B blog, "improved its GQA kernels in the generation phase ... 2.4x over v0.5"). A
property of the row's engine version, documented per row, never a fitted factor: spectool's
own predictions (current engines) read shared KV.

Only baseline rows enter here; the speculative parts are fitted afterwards on ``results.csv``
(:mod:`spectool.predict.loso`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from spectool.errors import BadInputError
from spectool.predict.cost import EngineFactors, forward_cost
from spectool.predict.model import Setup
from spectool.predict.published import read_csv_rows

STATIC = "static"
SINGLE_STREAM = "single-stream"
LOAD_KINDS = (STATIC, SINGLE_STREAM)
SHARED_KV = "shared"
PER_QUERY_HEAD = "per-query-head"
ATTENTION_KV = (SHARED_KV, PER_QUERY_HEAD)
# Factors fitted to the baseline rows, per engine with rows (stage 1 of the fit); their grids
# are spectool.predict.calibrate.DEFAULT_GRIDS'.
BASE_FITTED = ("bw_fraction", "step_overhead_s", "layer_overhead_s")


@dataclass(frozen=True)
class BaselineRow:
    """One row of ``baselines.csv``."""

    row_id: str
    source_id: str
    model: str
    engine: str
    gpu: str
    tp: int
    precision: str
    batch: int
    load_kind: str
    input_len: int | None
    output_len: int | None
    value: float  # output tokens/s per GPU (static) or per stream (single-stream)
    attention_kv: str = SHARED_KV  # ATTENTION_KV; load_baselines requires the column
    # whether the source states the batch (or one request at a time); load_baselines requires
    # the column. A row whose batch is assumed implies no step time and is not fitted
    batch_stated: bool = True


def load_baselines(folder: Path) -> list[BaselineRow]:
    """Every row of ``folder/baselines.csv``; errors name the file and the line."""
    path = folder / "baselines.csv"
    raw = read_csv_rows(path)
    rows = []
    for i, r in enumerate(raw, start=2):
        try:
            row = BaselineRow(
                row_id=r["row_id"],
                source_id=r["source_id"],
                model=r["model"],
                engine=r["engine"],
                gpu=r["gpu"],
                tp=int(r["tp"]),
                precision=r["precision"],
                batch=int(r["batch"]),
                load_kind=r["load_kind"],
                input_len=int(r["input_len"]) if r["input_len"].strip() else None,
                output_len=int(r["output_len"]) if r["output_len"].strip() else None,
                value=float(r["value"]),
                attention_kv=r["attention_kv"],
                batch_stated=_yes_no(r["batch_stated"]),
            )
        except (KeyError, ValueError) as exc:
            raise BadInputError(path, f"line {i}: {exc}") from exc
        if row.load_kind not in LOAD_KINDS:
            raise BadInputError(path, f"line {i}: load_kind {row.load_kind!r} not in {LOAD_KINDS}")
        if row.attention_kv not in ATTENTION_KV:
            raise BadInputError(
                path, f"line {i}: attention_kv {row.attention_kv!r} not in {ATTENTION_KV}"
            )
        if row.load_kind == STATIC and (row.input_len is None or row.output_len is None):
            raise BadInputError(path, f"line {i}: a static row needs input_len and output_len")
        if row.value <= 0 or row.batch < 1 or row.tp < 1:
            raise BadInputError(path, f"line {i}: value, batch and tp must be positive")
        rows.append(row)
    return rows


def _yes_no(text: str) -> bool:
    if text not in ("yes", "no"):
        raise ValueError(f"batch_stated {text!r} is neither yes nor no")
    return text == "yes"


def stated(rows: Sequence[BaselineRow]) -> list[BaselineRow]:
    """The rows whose source states the batch: the only ones a step time is fitted to or
    checked against (a throughput at an unknown batch says nothing about one step)."""
    return [r for r in rows if r.batch_stated]


def baseline_setup(
    row: BaselineRow,
    models: Mapping[str, Mapping[str, Any]],
    factors: Mapping[str, EngineFactors] | None = None,
) -> Setup:
    """The row's step-cost setup (no drafter; ``ngram`` costs nothing to draft, so the method
    does not matter for a plain decode step)."""
    from spectool.predict.published import engine_factors, geometry_from_published, hardware_for

    entry = models[row.model]
    target = geometry_from_published(entry, row.model, row.precision)
    if row.attention_kv == PER_QUERY_HEAD and entry.get("attention") != "mla":
        group = int(entry["num_attention_heads"]) / int(entry["num_key_value_heads"])
        target = replace(target, kv_bytes_per_token=target.kv_bytes_per_token * group)
    f = (factors or {}).get(row.engine) or engine_factors(row.engine)
    context = (row.input_len or 0) + (row.output_len or 0) // 2 or 512
    return Setup(target, "ngram", hardware_for(row.gpu), f, tp=row.tp, context=context)


def predict_value(
    row: BaselineRow,
    models: Mapping[str, Mapping[str, Any]],
    factors: Mapping[str, EngineFactors] | None = None,
) -> float:
    """The row's value as the model predicts it (same unit as ``row.value``)."""
    setup = baseline_setup(row, models, factors)
    step = setup.base_step(row.batch)
    if row.load_kind == SINGLE_STREAM:
        return 1.0 / step
    assert row.input_len is not None
    assert row.output_len is not None
    prefill = setup.factors.step_overhead_s + (
        forward_cost(
            setup.target,
            setup.hardware,
            setup.factors,
            row.batch,
            row.input_len,
            row.input_len / 2,
            row.tp,
        ).seconds
    )
    total = prefill + row.output_len * step
    return row.batch * row.output_len / total / row.tp


def predicted_step_ms(
    row: BaselineRow,
    models: Mapping[str, Mapping[str, Any]],
    factors: Mapping[str, EngineFactors] | None = None,
) -> float:
    """The model's plain decode step (ms) at the row's batch and mean context."""
    return baseline_setup(row, models, factors).base_step(row.batch) * 1e3


def published_step_ms(row: BaselineRow) -> float | None:
    """The decode step the source implies (ms): single-stream rows whose source states the batch
    only (1 / value); a static row's time mixes prefill and decode, and a row whose batch is
    assumed implies no step, so they give none."""
    return 1e3 / row.value if row.load_kind == SINGLE_STREAM and row.batch_stated else None


@dataclass(frozen=True)
class BaselineEvaluation:
    rows: tuple[tuple[BaselineRow, float], ...]  # (row, predicted value)

    @property
    def errors(self) -> list[float]:
        return [p / r.value - 1.0 for r, p in self.rows]

    @property
    def median_abs_error(self) -> float:
        return statistics.median(abs(e) for e in self.errors)


def evaluate_baselines(
    rows: list[BaselineRow],
    models: Mapping[str, Mapping[str, Any]],
    factors: Mapping[str, EngineFactors] | None = None,
) -> BaselineEvaluation:
    return BaselineEvaluation(tuple((r, predict_value(r, models, factors)) for r in rows))


def fit_baseline_factors(
    rows: list[BaselineRow],
    models: Mapping[str, Mapping[str, Any]],
    base: Mapping[str, EngineFactors],
) -> dict[str, EngineFactors]:
    """Per engine with more rows than :data:`BASE_FITTED` has names, those factors at the grid
    point minimising the mean |log(predicted / published)| of its absolute rows, the rest as in
    ``base[engine]``. An engine with fewer rows is left out (its caller keeps its prior): three
    factors fitted to one or two rows reproduce them and nothing else. Rows whose batch the
    source does not state are not fitted (:func:`stated`)."""
    from spectool.predict.calibrate import fit_factors

    rows = stated(rows)
    fitted: dict[str, EngineFactors] = {}
    for engine in sorted({r.engine for r in rows}):
        sub = [r for r in rows if r.engine == engine]
        if len(sub) <= len(BASE_FITTED):  # as many factors as rows: memorised, not fitted
            continue

        def loss(f: EngineFactors, sub: list[BaselineRow] = sub, engine: str = engine) -> float:
            return statistics.fmean(
                abs(math.log(predict_value(r, models, {engine: f}) / r.value)) for r in sub
            )

        fitted[engine] = fit_factors(base[engine], BASE_FITTED, loss, len(sub)).factors
    return fitted
