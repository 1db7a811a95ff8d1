"""NVIDIA's aiconfigurator-core as a second predictor of published decode steps (issue 23 item 5).

aiconfigurator-core (PyPI, Apache-2.0) predicts a step from per-kernel timings NVIDIA measured on
each GPU and engine version (``systems/data/<gpu>/<op>/<engine>/<version>``). This script asks it
for the plain decode step of every single-stream row of ``tests/data/published/baselines.csv``
whose model, GPU and engine its data covers, and prints it beside the published step and
spectool's, out of sample (leave-one-source-out, as the table's other checks) and in sample (the
shipped factors, fitted to these rows). Judged like any other source: against published numbers
it never saw. Not a dependency of spectool; install it in a separate environment first:

    python -m venv /tmp/aic && /tmp/aic/bin/pip install aiconfigurator-core==0.12.0
    PYTHONPATH=. /tmp/aic/bin/python benchmarks/aiconfigurator_vs_published.py

Needs pyyaml in that environment (aiconfigurator-core depends on it). ~1 min on 2 cores.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Row -> (HF id of a model config aiconfigurator ships, its system name, engine, layout kwargs).
# Only rows whose model, GPU and engine its data covers (aiconfigurator-core 0.12.0).
COVERED: dict[str, tuple[str, str, str, dict[str, object]]] = {
    "vllm20780-base": ("meta-llama/Meta-Llama-3.1-8B", "h100_sxm", "vllm", {"tp_size": 1}),
    "vpr16937-base": ("meta-llama/Meta-Llama-3.1-8B", "h100_sxm", "vllm", {"tp_size": 1}),
    "sglang-docs-base": ("meta-llama/Meta-Llama-3.1-8B", "h100_sxm", "sglang", {"tp_size": 1}),
    "eagle-issue251-qwen3-8b-base": ("Qwen/Qwen3-8B", "h200_sxm", "sglang", {"tp_size": 1}),
    "eagle-issue251-qwen3-30b-a3b-base": (
        "Qwen/Qwen3-30B-A3B",
        "h200_sxm",
        "sglang",
        {"tp_size": 1, "moe_tp_size": 1},
    ),
    "sf339-base": ("Qwen/Qwen3-30B-A3B", "h100_sxm", "sglang", {"tp_size": 2, "moe_tp_size": 2}),
    "as163-base": ("Qwen/Qwen3-30B-A3B", "h100_sxm", "sglang", {"tp_size": 4, "moe_tp_size": 4}),
    # TensorRT-LLM tech blog 1: MLA TP 8, MoE EP 2 (so MoE TP 4), "mixed nvfp4/bf16": asked
    # with aiconfigurator's default quantisation for the checkpoint.
    "trtblog1-base": (
        "deepseek-ai/DeepSeek-R1",
        "b200_sxm",
        "trtllm",
        {"tp_size": 8, "moe_tp_size": 4, "moe_ep_size": 2},
    ),
}


def main() -> int:
    try:
        from aiconfigurator_core.sdk.engine import EngineHandle
    except ImportError:
        print("aiconfigurator-core is not installed here: see this script's docstring")
        return 2
    from spectool.predict.baselines import load_baselines, predicted_step_ms, published_step_ms
    from spectool.predict.loso import leave_one_source_out_baselines
    from spectool.predict.published import load_models

    folder = ROOT / "tests/data/published"
    rows = {r.row_id: r for r in load_baselines(folder)}
    models = load_models(folder)
    loso = {
        r.row_id: 1e3 / value
        for r, value in leave_one_source_out_baselines(list(rows.values()), models).rows
    }
    print(
        f"{'row':36} {'engine':7} {'published':>9} {'aiconfig.':>16} {'spectool LOSO':>16}"
        f" {'in sample':>16}"
    )
    errors: dict[str, list[float]] = {
        "aiconfigurator": [],
        "spectool, leave-one-source-out": [],
        "spectool, in sample": [],
    }
    for row_id, (hf_id, system, backend, layout) in COVERED.items():
        row = rows[row_id]
        published = published_step_ms(row)
        assert published is not None
        context = (row.input_len or 0) + (row.output_len or 0) // 2 or 512
        handle = EngineHandle.compile(hf_id, system, backend, **layout)
        aic = handle.predict_decode_latency(1, context, 2)
        ours, held_out = predicted_step_ms(row, models), loso[row_id]
        errors["aiconfigurator"].append(aic / published - 1)
        errors["spectool, leave-one-source-out"].append(held_out / published - 1)
        errors["spectool, in sample"].append(ours / published - 1)
        print(
            f"{row_id:36} {backend:7} {published:6.2f} ms {aic:6.2f} ms {aic / published - 1:+5.0%}"
            f" {held_out:6.2f} ms {held_out / published - 1:+5.0%}"
            f" {ours:6.2f} ms {ours / published - 1:+5.0%}"
        )
    for name, errs in errors.items():
        within = sum(abs(e) <= 0.20 for e in errs)
        print(
            f"{name}: median |error| {statistics.median(abs(e) for e in errs):.1%} over "
            f"{len(errs)} published steps, {within} within 20 %"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
