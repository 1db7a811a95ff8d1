"""``spectool check``: will this drafter work with this target, on this engine and GPU?"""

from __future__ import annotations

from typing import Annotated

import typer

from spectool.cli.options import (
    DrafterArg,
    GpuOpt,
    JsonOpt,
    MaxBatchOpt,
    MaxDraftLenOpt,
    MaxSeqOpt,
    MethodOpt,
    ProfileOpt,
    TargetArg,
    TpOpt,
    TrtllmBackendOpt,
    TrtllmVersionOpt,
    TrustRemoteCodeOpt,
)

EngineOpt = Annotated[
    str, typer.Option("--engine", help="trtllm, torch or none (none: judge the checkpoints alone).")
]


def check(
    target: TargetArg = None,
    drafter: DrafterArg = None,
    profile: ProfileOpt = None,
    method: MethodOpt = "auto",
    max_draft_len: MaxDraftLenOpt = None,
    engine: EngineOpt = "trtllm",
    trtllm_version: TrtllmVersionOpt = None,
    trtllm_backend: TrtllmBackendOpt = "pytorch",
    gpu: GpuOpt = "auto",
    tp: TpOpt = 1,
    max_batch_size: MaxBatchOpt = None,
    max_seq_len: MaxSeqOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Pre-flight compatibility check of a target/drafter pair (reads headers, never weights).

    Exit 0 compatible, 1 incompatible, 2 bad input.
    """
    from spectool.check import CheckRequest, run_check

    report = run_check(
        CheckRequest(
            target=target,
            drafter=drafter,
            profile=profile,
            method=method,
            max_draft_len=max_draft_len,
            engine=engine,
            trtllm_version=trtllm_version,
            trtllm_backend=trtllm_backend,
            gpu=gpu,
            tp=tp,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            trust_remote_code=trust_remote_code,
        )
    )
    if as_json:
        from spectool.cli.output import print_json

        print_json(report.to_json())
    else:
        render_report(report)
    raise typer.Exit(0 if report.verdict == "compatible" else 1)


def render_report(report) -> None:  # noqa: ANN001 - CheckReport, imported lazily
    from rich.table import Table

    from spectool.ckpt.inspect import KIND_LABELS
    from spectool.cli.output import console, findings_table, gib, is_narrow

    fields = ("ref", "kind", "architecture", "hidden", "layers", "vocab", "dtype", "weights")
    rows = {
        role: (
            c.ref,
            KIND_LABELS[c.kind],
            str(c.architecture),
            str(c.hidden_size),
            str(c.num_layers),
            str(c.vocab_size),
            str(c.dtype),
            gib(c.weight_bytes),
        )
        for role, c in (("target", report.target), ("drafter", report.drafter))
        if c is not None
    }
    if is_narrow():  # one row per field, one column per checkpoint: no word is broken
        models = Table(title="Checkpoints", show_header=True)
        models.add_column("", no_wrap=True, style="bold")
        for role in rows:
            models.add_column(role, overflow="fold")
        for i, name in enumerate(fields):
            models.add_row(name, *(values[i] for values in rows.values()))
    else:
        models = Table(title="Checkpoints", show_header=True)
        models.add_column("role", no_wrap=True)
        models.add_column("ref", overflow="fold")
        models.add_column("kind")
        for name in fields[2:]:
            models.add_column(name, no_wrap=True)
        for role, values in rows.items():
            models.add_row(role, *values)
    console.print(models)
    engine = report.engine
    if report.trtllm:
        t = report.trtllm
        engine += f" {t['release']} ({t['backend']} backend{', installed ' + t['installed'] if t['installed'] else ', built-in table'})"
    console.print(
        f"method [bold]{report.method}[/], max_draft_len {report.max_draft_len}, engine {engine}"
    )
    if report.memory:
        m = report.memory
        console.print(
            f"memory on {m.gpu} (tp={m.tp}): target {gib(m.target_weight_bytes)}, drafter "
            f"{gib(m.drafter_weight_bytes)}, reserve {gib(m.reserve_bytes)}; sequences of "
            f"{m.max_seq_len} tokens: {m.sequences_without_drafter} without the drafter, "
            f"{m.sequences_with_drafter} with it"
        )
    elif report.gpu is None:
        console.print("memory: no GPU known (pass --gpu NAME for an estimate)")
    if report.findings:
        console.print(findings_table(report.findings))
    colour = "green" if report.verdict == "compatible" else "red"
    console.print(f"verdict: [bold {colour}]{report.verdict}[/]")


def register(app: typer.Typer) -> None:
    app.command("check")(check)
