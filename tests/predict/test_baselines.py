"""Absolute step times without speculation (issue 23): the plain decode step against published
speeds (tests/data/published/baselines.csv), with the shipped engine factors."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectool.errors import BadInputError
from spectool.predict.baselines import (
    PER_QUERY_HEAD,
    SHARED_KV,
    SINGLE_STREAM,
    STATIC,
    evaluate_baselines,
    load_baselines,
    predict_value,
    predicted_step_ms,
    published_step_ms,
)
from spectool.predict.published import load_models

PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "published"

# Rows whose published step the model misses by more than 20 %, each with what was found.
KNOWN_OFF = {
    # "On a single H200 GPU using the sglang inference framework ... Qwen3-30B-A3B ... from 147
    # tokens/second" (SafeAILab/EAGLE #251, 2025-07-02): slower than the same comment's dense
    # Qwen3-8B (186) although it reads a third of the bytes. SpecForge #339 (2x H100, TP 2:
    # 4.49 ms) and AngelSlim #163 (4x H100, TP 4: 4.57 ms) ran the same MoE under SGLang in
    # December 2025. No model whose step grows with the bytes a GPU reads fits all three: TP 2 ->
    # TP 4 halved the bytes per GPU and changed nothing, so the bytes term at TP 2 is small; one
    # H200 reads 2 x 3.35 / 4.8 = 1.4x those bytes per step and has no all-reduce, so it cannot
    # be 2.3 ms slower unless that term were > 5.7 ms, more than the whole 4.49 ms step. The
    # comment predates SGLang's Qwen EAGLE-3 support (sgl-project/sglang PR #7745, merged
    # 2025-07-05): a patched build of mid-2025; AngelSlim #9 (SGLang 0.4.9.post2, 2025-07-15)
    # reports ~130 tokens/s for the same model without EAGLE-3. Predicted 4.4 ms against 6.8;
    # NVIDIA's aiconfigurator-core (kernel timings of SGLang 0.5.14 on H200) predicts 3.9 ms
    # (benchmarks/aiconfigurator_vs_published.py).
    "eagle-issue251-qwen3-30b-a3b-base",
}


@pytest.fixture(scope="module")
def table() -> tuple[list, dict]:
    return load_baselines(PUBLISHED), load_models(PUBLISHED)


def test_table_covers_engines_gpus_and_batches(table: tuple[list, dict]) -> None:
    rows, _ = table
    assert len(rows) >= 25
    assert {"trtllm", "vllm", "sglang"} <= {r.engine for r in rows}
    assert len({r.gpu for r in rows}) >= 5
    assert len({r.batch for r in rows}) >= 8
    assert sum(r.engine == "trtllm" for r in rows) >= 15
    assert {r.load_kind for r in rows} == {STATIC, SINGLE_STREAM}


def test_whole_table_sources_and_tensorrt_llm_rows(table: tuple[list, dict]) -> None:
    """Issue 23's coverage, speed-up and baseline rows together: >= 150 rows, >= 15 independent
    sources and >= 30 TensorRT-LLM rows (the engine spectool deploys to)."""
    from spectool.predict.published import load_rows

    baselines, _ = table
    speedups = load_rows(PUBLISHED)
    sources = {r.source_id for r in speedups} | {b.source_id for b in baselines}
    assert len(sources) >= 15
    trt = sum(r.engine == "trtllm" for r in speedups) + sum(b.engine == "trtllm" for b in baselines)
    assert trt >= 30
    assert len(speedups) + len(baselines) >= 150


def test_published_step_times_within_20_percent(table: tuple[list, dict]) -> None:
    """Every row that publishes a decode step (one stream: 1 / tokens per second)."""
    rows, models = table
    steps = [r for r in rows if published_step_ms(r) is not None]
    assert len(steps) >= 8
    off = {
        r.row_id: (round(predicted_step_ms(r, models), 2), round(published_step_ms(r) or 0, 2))
        for r in steps
        if abs(predicted_step_ms(r, models) / (published_step_ms(r) or 1) - 1) > 0.20
    }
    assert set(off) <= KNOWN_OFF, off


def test_static_rows_median_error(table: tuple[list, dict]) -> None:
    """TensorRT-LLM's static-batch tables (batch 16-1024, prefill and decode): median within
    15 % in sample."""
    rows, models = table
    static = [r for r in rows if r.load_kind == STATIC]
    assert evaluate_baselines(static, models).median_abs_error <= 0.15


def test_static_prediction_counts_prefill(table: tuple[list, dict]) -> None:
    """A long prompt costs throughput: the same batch and output with 2048 input tokens instead
    of 128 predicts fewer tokens per second."""
    from dataclasses import replace

    rows, models = table
    row = next(r for r in rows if r.load_kind == STATIC and r.input_len == 128)
    long = replace(row, input_len=2048)
    assert predict_value(long, models) < predict_value(row, models)


def test_per_query_head_kv_reads_cost_a_gqa_model_its_group(table: tuple[list, dict]) -> None:
    """A row measured on an engine that read a GQA KV cache once per query head (TensorRT-LLM
    v0.5-v0.6, baselines.csv attention_kv) predicts fewer tokens/s than the same row read once
    per KV head; for an MHA model the two are the same."""
    from dataclasses import replace

    rows, models = table
    gqa = max(
        (r for r in rows if r.model == "llama-2-70b" and r.attention_kv == PER_QUERY_HEAD),
        key=lambda r: r.output_len or 0,
    )
    assert predict_value(gqa, models) < 0.8 * predict_value(
        replace(gqa, attention_kv=SHARED_KV), models
    )
    mha = next(r for r in rows if r.model == "gpt-j-6b" and r.attention_kv == PER_QUERY_HEAD)
    assert predict_value(mha, models) == predict_value(replace(mha, attention_kv=SHARED_KV), models)


def test_bad_rows_are_one_line_errors(tmp_path: Path) -> None:
    text = (PUBLISHED / "baselines.csv").read_text(encoding="utf-8")
    header = text.splitlines()[0]
    (tmp_path / "baselines.csv").write_text(
        header + "\nx,s,u,l,m,trtllm,h100-sxm,1,fp8,8,static,,,shared,100,u,n\n", encoding="utf-8"
    )
    with pytest.raises(BadInputError, match="static row needs input_len"):
        load_baselines(tmp_path)
    (tmp_path / "baselines.csv").write_text(
        header + "\nx,s,u,l,m,trtllm,h100-sxm,1,fp8,8,steady,,,shared,100,u,n\n", encoding="utf-8"
    )
    with pytest.raises(BadInputError, match="load_kind"):
        load_baselines(tmp_path)
    (tmp_path / "baselines.csv").write_text(
        header + "\nx,s,u,l,m,trtllm,h100-sxm,1,fp8,8,static,1,1,xqa,100,u,n\n", encoding="utf-8"
    )
    with pytest.raises(BadInputError, match="attention_kv"):
        load_baselines(tmp_path)
    with pytest.raises(BadInputError, match="cannot read"):
        load_baselines(tmp_path / "missing")
