"""``spectool check``: will this drafter work with this target, on this engine and GPU?"""

from __future__ import annotations

from typing import Annotated

import typer

from spectool.cli.help import MAIN, command_class, option
from spectool.cli.options import (
    AcceptanceLengthOpt,
    AcceptanceRateOpt,
    AttentionDpOpt,
    ConcurrencyListOpt,
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

EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="trtllm, torch or none (none: judge the checkpoints alone).",
        rich_help_panel=MAIN,
    ),
]
CheckMaxBatchOpt = option(MaxBatchOpt, default="none: the estimate says how many fit")


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
    pp: PpOpt = 1,
    ep: EpOpt = 1,
    attention_dp: AttentionDpOpt = False,
    nodes: NodesOpt = 1,
    gpus_per_node: GpusPerNodeOpt = None,
    max_batch_size: CheckMaxBatchOpt = None,
    max_seq_len: MaxSeqOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    concurrency: ConcurrencyListOpt = None,
    acceptance_length: AcceptanceLengthOpt = None,
    acceptance_rate: AcceptanceRateOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pre-flight compatibility check of a target/drafter pair (reads headers, never weights).

    With a GPU (--gpu NAME) it also predicts whether speculation pays per concurrency.
    Exit 0 compatible, 1 incompatible, 2 bad input, 3 unverified (headers unavailable offline;
    the prediction from the profile's geometry is still printed).
    """
    from spectool.check import CheckRequest, run_check
    from spectool.tuning.request import parse_concurrencies

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
            pp=pp,
            ep=ep,
            attention_dp=attention_dp,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            trust_remote_code=trust_remote_code,
            concurrency=parse_concurrencies(concurrency) if concurrency else None,
            acceptance_length=acceptance_length,
            acceptance_rate=acceptance_rate,
        )
    )
    if as_json:
        from spectool.cli.output import print_json

        print_json(report.to_json())
    else:
        render_report(report)
    raise typer.Exit({"compatible": 0, "incompatible": 1}.get(report.verdict, 3))


def render_report(report) -> None:  # noqa: ANN001 - CheckReport, imported lazily
    from spectool.cli.output import console, findings_table, gib

    if report.target is None:
        console.print("checkpoints: headers unavailable (finding HEADERS_UNAVAILABLE)")
    else:
        console.print(_models_table(report))
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
        if m.per_rank:
            console.print(_ranks_table(m))
    elif report.gpu is None:
        console.print("memory: no GPU known (pass --gpu NAME for an estimate)")
    if report.findings:
        console.print(findings_table(report.findings))
    if report.pays is not None:
        render_pays(report.pays)
    colour = {"compatible": "green", "incompatible": "red"}.get(report.verdict, "yellow")
    console.print(f"verdict: [bold {colour}]{report.verdict}[/]")


def render_pays(pays: dict) -> None:
    """The "will it pay" section: inputs named, one line per concurrency, break-even."""
    from spectool.cli.output import console

    console.print("[bold]will it pay[/] (predicted, not measured)")
    if "skipped" in pays:
        console.print(f"  not predicted: {pays['skipped']}")
        return
    from spectool.cli.output import layout_words

    acc = pays["acceptance"]
    lay = pays.get("layout")
    where = f"tp={pays['tp']}" if lay is None else layout_words(lay)
    console.print(
        f"  {pays['method']} on {pays['hardware']} ({where}, context {pays['context']})"
        f"; geometry: {pays['geometry']}",
        markup=False,
    )
    console.print(f"  calibration: {pays['factors']}")
    console.print(
        "  acceptance: "
        + (
            "none given (no flag, no profile figure): break-even acceptance per concurrency"
            if acc is None
            else acc["source"]
        ),
        markup=False,
    )
    for line in pays["lines"]:
        console.print(f"  {line}", markup=False)


def _models_table(report):  # noqa: ANN001, ANN202 - CheckReport -> rich Table
    from rich.table import Table

    from spectool.ckpt.inspect import KIND_LABELS
    from spectool.cli.output import gib, is_narrow

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
    models = Table(title="Checkpoints", show_header=True)
    if is_narrow():  # one row per field, one column per checkpoint: no word is broken
        models.add_column("", no_wrap=True, style="bold")
        for role in rows:
            models.add_column(role, overflow="fold")
        for i, name in enumerate(fields):
            models.add_row(name, *(values[i] for values in rows.values()))
    else:
        models.add_column("role", no_wrap=True)
        models.add_column("ref", overflow="fold")
        models.add_column("kind")
        for name in fields[2:]:
            models.add_column(name, no_wrap=True)
        for role, values in rows.items():
            models.add_row(role, *values)
    return models


def _ranks_table(memory):  # noqa: ANN001, ANN202 - MemoryEstimate -> rich Table
    """Memory per rank, one row per pipeline stage (its TP ranks hold the same)."""
    from rich.table import Table

    from spectool.cli.output import gib

    lay = memory.layout or {}
    title = (
        f"Per rank: TP {lay.get('tp')} x PP {lay.get('pp')}, EP {lay.get('ep')}"
        f"{', attention DP' if lay.get('attention_dp') else ''} on {lay.get('nodes')} x "
        f"{lay.get('gpus_per_node')} GPUs"
    )
    table = Table(title=title, show_header=True)
    for name in ("ranks", "node", "layers", "target", "experts", "drafter", "KV B/tok", "seqs"):
        table.add_column(name, overflow="fold")
    for row in memory.per_rank:
        experts = "-"  # a dense model
        if row["experts_per_rank"]:
            experts = f"{gib(row['expert_bytes'])} ({row['experts_per_rank']}/layer)"
        table.add_row(
            row["ranks"],
            row["nodes"],
            row["layers"],
            gib(row["weight_bytes"] - row["drafter_bytes"]),
            experts,
            gib(row["drafter_bytes"]),
            str(row["kv_bytes_per_token"] + row["drafter_kv_bytes_per_token"]),
            f"{row['sequences_without_drafter']}/{row['sequences_with_drafter']}",
        )
    table.caption = (
        "target: weights per rank incl. experts and embedding; drafter: "
        f"{memory.per_rank[0]['drafter_placement']}; seqs: without/with the drafter"
    )
    return table


def _help_defaults() -> dict[str, str]:
    from spectool.check import DEFAULT_MAX_SEQ_LEN

    return {**shared_help_defaults(), "max_seq_len": f"the model's, at most {DEFAULT_MAX_SEQ_LEN}"}


def register(app: typer.Typer) -> None:
    app.command("check", cls=command_class(_help_defaults))(check)
