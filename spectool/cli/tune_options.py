"""The options of ``spectool tune``, in help panels, and their engine-dependent defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from spectool.cli.help import (
    ADVANCED,
    ENGINE,
    LOAD,
    MAIN,
    OUTPUT,
    PREDICTION,
    WORKLOAD,
    option,
)
from spectool.cli.options import (
    GpuOpt,
    MaxBatchOpt,
    shared_help_defaults,
)

TuneEngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="auto (trtllm when trtllm-serve is installed, else torch), trtllm, or torch "
        "(spectool's embedded engine).",
        rich_help_panel=MAIN,
    ),
]
ConcurrencyOpt = Annotated[
    str | None,
    typer.Option(
        "--concurrency",
        help="Comma-separated concurrency levels; the largest is the server's batch limit.",
        rich_help_panel=LOAD,
    ),
]
WorkloadOpt = Annotated[
    Path | None,
    typer.Option(
        "--workload",
        help="Your traffic, format told by the content: {prompt, max_tokens?, category?} lines "
        "or OpenAI /v1/completions or /v1/chat/completions request bodies (JSONL; their own "
        "lengths and sampling kept), ShareGPT conversations (JSON list or JSONL), Spec-Bench "
        "question.jsonl, or a mooncake/AIPerf trace (timestamp, input_length, output_length, "
        "hash_ids?).",
        show_default="built-in prompts from the Python standard library",
        rich_help_panel=WORKLOAD,
    ),
]
NumPromptsOpt = Annotated[
    int | None,
    typer.Option(
        "--num-prompts",
        help="Measured requests per trial, at least 2 x concurrency.",
        rich_help_panel=WORKLOAD,
    ),
]
MaxTokensOpt = Annotated[
    int | None,
    typer.Option("--max-tokens", help="Output tokens per request.", rich_help_panel=WORKLOAD),
]
RepeatsOpt = Annotated[
    int,
    typer.Option("--repeats", help="Trials per measured cell, pooled.", rich_help_panel=LOAD),
]
TuneOutOpt = Annotated[Path, typer.Option("--out", help="Output folder.", rich_help_panel=MAIN)]
ResumeOpt = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="Continue a run in --out; finished trials are not redone.",
        rich_help_panel=OUTPUT,
    ),
]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Start over in an --out that holds earlier results.",
        rich_help_panel=OUTPUT,
    ),
]
DeviceOpt = Annotated[
    str,
    typer.Option("--device", help="torch: cpu, cuda, cuda:N or auto.", rich_help_panel=ENGINE),
]
DtypeOpt = Annotated[
    str,
    typer.Option("--dtype", help="torch: float32, bfloat16, float16.", rich_help_panel=ENGINE),
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        help="torch: server threads.",
        show_default="all cores but one",
        rich_help_panel=ENGINE,
    ),
]
ReadyTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--ready-timeout",
        help="Seconds a server may take to load.",
        rich_help_panel=ADVANCED,
    ),
]
ConfidenceOpt = Annotated[
    float,
    typer.Option(
        "--confidence", help="Confidence of the decision's intervals.", rich_help_panel=ADVANCED
    ),
]
SeedOpt = Annotated[
    int,
    typer.Option("--seed", help="Seed of the prompts and the bootstrap.", rich_help_panel=ADVANCED),
]
BudgetOpt = Annotated[
    float,
    typer.Option(
        "--budget",
        help="Seconds of measuring per speculative cell: paired blocks are added until the "
        "cell is settled or this is spent and it holds 8 pairs (then it is inconclusive).",
        rich_help_panel=LOAD,
    ),
]
ObjectiveOpt = Annotated[
    str,
    typer.Option(
        "--objective",
        help="What decides, paired per cell from the client's records of both arms: tpot "
        "(time per output token after the first, what each user feels), e2e (request latency), "
        "ttft, their tails tpot@p90, tpot@p99, e2e@p90, e2e@p99, ttft@p90, ttft@p99 (each "
        "arm's blocks pooled), throughput, goodput (requests per second that met every "
        "--slo limit, vLLM's --goodput; needs --slo), or steps (the engine's decode steps, "
        "the cost inequality).",
        rich_help_panel=LOAD,
    ),
]
TemperatureOpt = Annotated[
    float,
    typer.Option(
        "--temperature",
        help="Sampling temperature of every request (0: greedy). Acceptance falls as it "
        "rises, so tune at your traffic's temperature.",
        rich_help_panel=LOAD,
    ),
]
TopPOpt = Annotated[
    float,
    typer.Option(
        "--top-p",
        help="Nucleus sampling of every request that sets none of its own (1: off); with "
        "--temperature.",
        rich_help_panel=LOAD,
    ),
]
TimeScaleOpt = Annotated[
    float | None,
    typer.Option(
        "--time-scale",
        help="Multiplies a trace workload's timestamps (2: half the arrival rate); kept on the "
        "prompts for a replay.",
        show_default="1 (the trace's own pace)",
        rich_help_panel=WORKLOAD,
    ),
]
RequestRateOpt = Annotated[
    str | None,
    typer.Option(
        "--request-rate",
        help="Comma-separated arrival rates (req/s): after the choice, the deployment is "
        "measured against the baseline at each, open loop, in paired blocks with the same "
        "arrivals (a trace workload is also replayed at its own pace).",
        show_default="(none)",
        rich_help_panel=LOAD,
    ),
]
BurstinessOpt = Annotated[
    float,
    typer.Option(
        "--burstiness",
        help="Shape of the gamma gaps between --request-rate arrivals (1: Poisson; below 1 "
        "burstier, above 1 steadier), as vLLM's --burstiness.",
        rich_help_panel=LOAD,
    ),
]
CapacityOpt = Annotated[
    bool,
    typer.Option(
        "--capacity",
        help="After the choice, find the highest arrival rate the deployment and the baseline "
        "each sustain within --slo (doubling, then bisection; paired open-loop probes).",
        rich_help_panel=LOAD,
    ),
]
SloOpt = Annotated[
    str | None,
    typer.Option(
        "--slo",
        help="Service-level objective for --capacity and --objective goodput: terms "
        "metric:LIMIT, each optionally @pQ, e.g. ttft:200ms,tpot:30ms@p99,e2e:2s (ms when no "
        "unit; p99 when no percentile). --capacity holds each term's percentile to its limit; "
        "goodput counts the requests that met every limit on their own (percentiles unused).",
        show_default="(none)",
        rich_help_panel=LOAD,
    ),
]
MinGainOpt = Annotated[
    float,
    typer.Option(
        "--min-gain",
        help="Choose speculation only if it beats the baseline by this fraction.",
        rich_help_panel=ADVANCED,
    ),
]


PredictOnlyOpt = Annotated[
    bool,
    typer.Option(
        "--predict-only",
        help="Measure nothing: decision.json and the build from the step-cost model (predicted, "
        "not measured; torch: CPU probe, trtllm: engine defaults for --gpu).",
        rich_help_panel=PREDICTION,
    ),
]
AcceptanceFromOpt = Annotated[
    Path | None,
    typer.Option(
        "--acceptance-from",
        help="--predict-only: acceptance measured by an earlier tune run (its folder or tune.json).",
        show_default="none",
        rich_help_panel=PREDICTION,
    ),
]

GpusOpt = Annotated[
    int | None,
    typer.Option(
        "--gpus",
        show_default="one server's GPUs",
        help="trtllm: GPUs tune may use, in sets of one server's GPUs (--tp). Two sets or more: "
        "the baseline server stays up beside the speculative one and each pair of blocks is "
        "measured at the same moment (concurrent design); one set: one server at a time, the "
        "baseline measured before and after (bracketed design).",
        rich_help_panel=ENGINE,
    ),
]
LauncherOpt = Annotated[
    str,
    typer.Option(
        "--launcher",
        help="trtllm: how servers start: local (CUDA_VISIBLE_DEVICES per GPU set) or slurm (one "
        "srun --exact --gres=gpu:<tp> job step per server; a job per server outside an "
        "allocation).",
        rich_help_panel=ENGINE,
    ),
]

TuneGpuOpt = option(GpuOpt, panel=ENGINE)
TuneMaxBatchOpt = option(MaxBatchOpt, default="the largest --concurrency")


def help_defaults() -> dict[str, str]:
    """The defaults that depend on the engine, from the table the run uses."""
    from spectool.check import DEFAULT_MAX_SEQ_LEN
    from spectool.deploy.limits import TORCH_DEFAULT_MAX_SEQ_LEN
    from spectool.tuning.request import ENGINE_DEFAULTS

    def per_engine(show: Any) -> str:
        return "; ".join(f"{engine}: {show(d)}" for engine, d in ENGINE_DEFAULTS.items())

    return {
        **shared_help_defaults(),
        "concurrency": per_engine(lambda d: ",".join(map(str, d.concurrencies))),
        "num_prompts": per_engine(lambda d: d.num_prompts),
        "max_tokens": per_engine(lambda d: d.max_tokens),
        "ready_timeout": per_engine(lambda d: f"{d.ready_timeout_s:g}"),
        "max_seq_len": f"torch: {TORCH_DEFAULT_MAX_SEQ_LEN}; trtllm: the model's, at most "
        f"{DEFAULT_MAX_SEQ_LEN}",
    }
