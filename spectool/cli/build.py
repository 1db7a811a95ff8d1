"""``spectool build``: check the pair, then write a build folder fitted to the GPU.

TensorRT-LLM: ``speculative.yaml`` and ``baseline.yaml`` (extra LLM-API options for
``trtllm-serve --config``), legacy TensorRT engines where ``--trtllm-backend tensorrt``; the
embedded engine (``--engine torch``): ``speculative.json`` and ``baseline.json``. Always
``manifest.json``. Exit 0 written, 1 the check found errors (nothing written), 2 bad input
(including an existing different build without ``--force``), 3 an engine build step failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spectool.cli.help import ADVANCED, ENGINE, MAIN, OUTPUT, command_class, option
from spectool.cli.options import (
    AttentionDpOpt,
    DrafterArg,
    EpOpt,
    GpuOpt,
    GpusPerNodeOpt,
    JsonOpt,
    MaxBatchOpt,
    MaxDraftLenOpt,
    MaxSeqOpt,
    MethodOpt,
    NodesOpt,
    PpOpt,
    ProfileOpt,
    TargetArg,
    TpOpt,
    TrtllmBackendOpt,
    TrtllmVersionOpt,
    TrustRemoteCodeOpt,
    shared_help_defaults,
)

OutOpt = Annotated[Path, typer.Option("--out", help="Build folder to write.", rich_help_panel=MAIN)]
BuildEngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="trtllm (TensorRT-LLM configs) or torch (spectool's embedded engine).",
        rich_help_panel=MAIN,
    ),
]
DecisionOpt = Annotated[
    Path | None,
    typer.Option(
        "--decision",
        help="decision.json from spectool tune: writes its draft_len_schedule/max_concurrency.",
        show_default="none: speculation unmeasured",
        rich_help_panel=MAIN,
    ),
]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force", help="Replace a different build already in --out.", rich_help_panel=OUTPUT
    ),
]
InertGateOpt = Annotated[
    str,
    typer.Option(
        "--inert-gate",
        help="Where the release ignores a runtime gate for the method (eagle3/mtp one-model on "
        "1.1/1.2): serve (no gate; serve's cost gate picks the baseline under load) or "
        "two-model (eagle3_one_model: false, where the gate works; a different step cost).",
        rich_help_panel=ENGINE,
    ),
]
DownloadOpt = Annotated[
    bool,
    typer.Option(
        "--download",
        help="Releases whose PyTorch backend needs a local draft model (1.0, 1.1): download a "
        "hub drafter with huggingface_hub and write its local snapshot path.",
        rich_help_panel=ADVANCED,
    ),
]
RelaxedOpt = Annotated[
    str | None,
    typer.Option(
        "--mtp-relaxed-acceptance",
        metavar="TOPK,DELTA",
        help="MTP on TensorRT-LLM only: relaxed acceptance for thinking, relaxed_topk TOPK "
        "and relaxed_delta DELTA (e.g. 10,0.6, TensorRT-LLM's DeepSeek-R1 recipe). Lossy: while "
        "thinking, a draft among the target's top TOPK within DELTA of the best is accepted, so "
        "outputs are no longer the target's own.",
        show_default="not written: exact verification",
        rich_help_panel=ENGINE,
    ),
]
ExamplesOpt = Annotated[
    Path | None,
    typer.Option(
        "--trtllm-examples",
        help="Legacy TensorRT backend: the TensorRT-LLM repository's examples folder "
        "(convert_checkpoint.py scripts).",
        show_default="none",
        rich_help_panel=ADVANCED,
    ),
]

BuildMaxBatchOpt = option(MaxBatchOpt, default="fitted to the GPU's memory")
BuildMaxSeqOpt = option(MaxSeqOpt, default="the model's, capped")


def build(
    target: TargetArg = None,
    drafter: DrafterArg = None,
    profile: ProfileOpt = None,
    method: MethodOpt = "auto",
    max_draft_len: MaxDraftLenOpt = None,
    out: OutOpt = Path("build"),
    engine: BuildEngineOpt = "trtllm",
    trtllm_version: TrtllmVersionOpt = None,
    trtllm_backend: TrtllmBackendOpt = "pytorch",
    gpu: GpuOpt = "auto",
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    ep: EpOpt = 1,
    attention_dp: AttentionDpOpt = False,
    nodes: NodesOpt = 1,
    gpus_per_node: GpusPerNodeOpt = None,
    max_batch_size: BuildMaxBatchOpt = None,
    max_seq_len: BuildMaxSeqOpt = None,
    decision: DecisionOpt = None,
    force: ForceOpt = False,
    trtllm_examples: ExamplesOpt = None,
    inert_gate: InertGateOpt = "serve",
    download: DownloadOpt = False,
    mtp_relaxed_acceptance: RelaxedOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Write a build folder: serving configs fitted to the GPU, and a manifest.

    Runs spectool check first and writes nothing when it finds errors (exit 1).
    """
    from spectool.deploy.build import (
        BuildRequest,
        check_build,
        parse_relaxed_acceptance,
        plan_build,
        run_engine_steps,
        write_build,
    )

    request = BuildRequest(
        target=target,
        drafter=drafter,
        profile=profile,
        method=method,
        max_draft_len=max_draft_len,
        out=out,
        engine=engine,
        trtllm_version=trtllm_version,
        trtllm_backend=trtllm_backend,
        gpu=gpu,
        tp=tp,
        pp=pp,
        ep=ep,
        attention_dp=attention_dp,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        max_batch_size=max_batch_size,
        max_seq_len=max_seq_len,
        decision=decision,
        force=force,
        trust_remote_code=trust_remote_code,
        trtllm_examples=trtllm_examples,
        inert_gate=inert_gate,
        download=download,
        mtp_relaxed_acceptance=parse_relaxed_acceptance(mtp_relaxed_acceptance),
    )
    inputs = check_build(request)
    if inputs.report.errors:
        if as_json:
            from spectool.cli.output import print_json

            print_json({"written": False, "check": inputs.report.to_json()})
        else:
            from spectool.cli.check import render_report
            from spectool.cli.output import console

            render_report(inputs.report)
            console.print("[bold red]build refused[/]: the check found errors; nothing written")
        raise typer.Exit(1)
    plan = plan_build(inputs)
    written = write_build(plan, force=force)
    if plan.steps:
        from spectool.cli.output import err_console

        run_engine_steps(plan, on_output=lambda line: err_console.print(line, markup=False))
    if as_json:
        from spectool.cli.output import print_json

        print_json(
            {
                "written": True,
                "out": str(plan.out),
                "files": [p.name for p in written],
                "manifest": plan.manifest.model_dump(mode="json"),
                "warnings": list(plan.warnings),
            }
        )
    else:
        _render(plan, written)


def _render(plan, written: list[Path]) -> None:  # noqa: ANN001 - BuildPlan, imported lazily
    from spectool.cli.output import console

    m = plan.manifest
    engine = m.engine
    if m.trtllm is not None:
        engine += f" {m.trtllm.release} ({m.trtllm.backend} backend)"
    gpu = f"{m.gpu.name} (SM{m.gpu.sm})" if m.gpu.name else "no GPU (CPU)"
    console.print(
        f"built [bold]{m.method}[/] k={m.max_draft_len} for {engine} on {gpu}, tp={m.tp}: "
        f"max_batch_size {m.limits.max_batch_size}, max_seq_len {m.limits.max_seq_len}"
        + (
            f", KV fraction {m.limits.free_gpu_memory_fraction}"
            if m.limits.free_gpu_memory_fraction is not None
            else ""
        )
    )
    if m.runtime_gate is not None:
        console.print(
            f"runtime gate: {m.runtime_gate.kind}, no speculation above batch size "
            f"{m.runtime_gate.off_above}"
        )
    if m.decision is not None and m.decision.predicted:
        console.print(
            "decision: [bold yellow]predicted, not measured[/] (tune --predict-only; "
            f"acceptance: {(m.decision.prediction or {}).get('acceptance')}); run spectool tune "
            "to measure it",
        )
    elif m.runtime_gate is None and m.decision is None:
        console.print(
            "no tune decision: speculation is unmeasured (spectool tune, then --decision)"
        )
    for line in (*plan.warnings, *m.notes):
        console.print(f"note: {line}", markup=False, style="yellow")
    for path in written:
        console.print(f"wrote {path}")
    lay = m.parallel
    if lay is not None:
        console.print(
            f"layout: TP {lay.tp} x PP {lay.pp} = {lay.world_size} ranks, EP {lay.ep}"
            f"{', attention DP' if lay.attention_dp else ''}, {lay.nodes} node(s) x "
            f"{lay.gpus_per_node} GPUs; per rank: "
            + ", ".join(
                f"ranks {r['ranks']} {r['weight_bytes'] / 1024**3:.1f} GiB weights"
                for r in lay.per_rank
            ),
            markup=False,
        )
    if lay is not None and lay.nodes > 1:
        console.print(
            f"start it: spectool serve {plan.out} --launcher slurm, or sbatch "
            f"{plan.out / 'launch.slurm'} (or HOSTFILE=... bash {plan.out / 'launch-mpirun.sh'}; "
            f"Kubernetes: kubectl apply -f {plan.out / 'lws.yaml'})",
            markup=False,
        )
    else:
        console.print("serve it: spectool serve " + str(plan.out))


def _help_defaults() -> dict[str, str]:
    from spectool.check import DEFAULT_MAX_SEQ_LEN
    from spectool.deploy.limits import TORCH_DEFAULT_MAX_BATCH_SIZE, TORCH_DEFAULT_MAX_SEQ_LEN

    return {
        **shared_help_defaults(),
        "max_batch_size": f"fitted to the GPU's memory; torch: {TORCH_DEFAULT_MAX_BATCH_SIZE}",
        "max_seq_len": f"the model's, at most {DEFAULT_MAX_SEQ_LEN}; torch: "
        f"{TORCH_DEFAULT_MAX_SEQ_LEN}",
    }


def register(app: typer.Typer) -> None:
    app.command("build", cls=command_class(_help_defaults))(build)
