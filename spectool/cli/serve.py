"""``spectool serve``: an OpenAI-compatible server for a target (and drafter), or a build folder.

Two forms:

* ``spectool serve [TARGET [DRAFTER]] --engine torch``: spectool's embedded PyTorch engine
  (CPU or CUDA) in this process; with no TARGET the embedded demo pair. The command checks its
  options and hands one :class:`~spectool.cli.serve_torch.TorchServeRequest` to
  :func:`~spectool.cli.serve_torch.serve_torch` (engine settings from flags, or from a build's
  config file with ``--engine-config``).
* ``spectool serve DIR [-- EXTRA]``: a folder written by ``spectool build``. Its manifest is
  checked against this machine, the cost gate (``--speculation auto|on|off``) picks the
  speculative or the baseline config, and the server runs as a supervised child process
  (``trtllm-serve``, or spectool's own server for ``--engine torch`` builds): its log streams
  here, spectool waits for ``/health``, prints the endpoint, forwards SIGINT/SIGTERM and leaves
  no process behind. Arguments after ``--`` go to the child. Exit 3 (with the log tail) when the
  child fails, 2 when ``trtllm-serve`` is missing or the port is taken, 1 when the build does
  not fit this machine.

fastapi, uvicorn and torch are imported only inside the command body so that ``spectool --help``
stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from spectool.cli.help import ADVANCED, ENGINE, LOAD, MAIN, OUTPUT, SpectoolCommand, option
from spectool.cli.options import DrafterArg, MaxBatchOpt, MaxDraftLenOpt, MaxSeqOpt, TargetArg
from spectool.cli.serve_torch import (
    TORCH_DEFAULT_MAX_BATCH_SIZE,
    TORCH_DEFAULT_MAX_DRAFT_LEN,
    TORCH_DEFAULT_MAX_SEQ_LEN,
    TORCH_METHODS,
    TorchServeRequest,
    parse_draft_len_schedule,
    serve_torch,
    torch_serve_request,
)
from spectool.errors import BadInputError

__all__ = [
    "TORCH_METHODS",
    "TorchServeRequest",
    "parse_draft_len_schedule",
    "register",
    "serve",
    "torch_serve_request",
]

ENGINES = ("torch", "trtllm")

EngineOpt = Annotated[
    str | None,
    typer.Option(
        "--engine",
        help="torch: spectool's embedded PyTorch engine (CPU/CUDA); trtllm: TensorRT-LLM, for a "
        "build DIR.",
        show_default="the build's engine, else torch",
        rich_help_panel=MAIN,
    ),
]
SpeculationOpt = Annotated[
    str,
    typer.Option(
        "--speculation",
        help="Build DIR: auto (the cost gate: on only where the build's tune decision shows it "
        "pays), on or off.",
        rich_help_panel=MAIN,
    ),
]
ExpectedConcurrencyOpt = Annotated[
    int | None,
    typer.Option(
        "--expected-concurrency",
        help="Build DIR: concurrent requests you expect; the cost gate judges speculation there.",
        show_default="the largest concurrency the decision measured",
        rich_help_panel=LOAD,
    ),
]
ServeThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        help="torch engine: intra-op threads (tune measures with every core but one).",
        show_default="all cores but one",
        rich_help_panel=ADVANCED,
    ),
]
ExpectedRateOpt = Annotated[
    float | None,
    typer.Option(
        "--expected-rate",
        help="Build DIR: arrival rate you expect (req/s); the cost gate judges speculation by "
        "the tune decision's measured rate levels (tune --request-rate).",
        show_default="(none)",
        rich_help_panel=LOAD,
    ),
]
LAUNCHERS = ("local", "slurm", "mpirun")
LauncherOpt = Annotated[
    str,
    typer.Option(
        "--launcher",
        help="Build DIR (TensorRT-LLM): local (trtllm-serve here), slurm (the build's layout as a "
        "Slurm batch job: sbatch, /health on the head rank, scancel on Ctrl-C) or mpirun "
        "(mpirun -np WORLD trtllm-llmapi-launch ..., over $HOSTFILE's hosts or this one).",
        rich_help_panel=LOAD,
    ),
]
ReadyTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--ready-timeout",
        help="Build DIR: seconds to wait for /health.",
        rich_help_panel=ADVANCED,
    ),
]
MaxConcurrencyOpt = Annotated[
    int | None,
    typer.Option(
        "--max-concurrency",
        help="torch engine: no speculation above this batch size.",
        show_default="none: speculation at every batch size",
        rich_help_panel=ENGINE,
    ),
]
DraftLenScheduleOpt = Annotated[
    str | None,
    typer.Option(
        "--draft-len-schedule",
        help="torch engine: batch:k pairs, e.g. 4:4,8:2 (batch sizes up to 4 draft 4, up to 8 "
        "draft 2, larger none).",
        show_default="none",
        rich_help_panel=ENGINE,
    ),
]
EngineConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--engine-config",
        help="torch engine: a config file written by spectool build (speculative.json or "
        "baseline.json) giving the method, draft length, runtime gate and limits.",
        show_default="none: the flags",
        rich_help_panel=ENGINE,
    ),
]
READY_TIMEOUT_S = {"trtllm": 1800.0, "torch": 300.0}
ReadyTimeoutOpt = option(
    ReadyTimeoutOpt, default=", ".join(f"{s:g} {e}" for e, s in READY_TIMEOUT_S.items())
)
ServeMethodOpt = Annotated[
    str,
    typer.Option(
        "--method",
        help=f"torch engine: {', '.join(TORCH_METHODS)} (auto: draft_model with a "
        "drafter, else none).",
        rich_help_panel=MAIN,
    ),
]
HostOpt = Annotated[
    str,
    typer.Option(
        "--host", help="Address to listen on (127.0.0.1: this machine only).", rich_help_panel=MAIN
    ),
]
PortOpt = Annotated[
    int, typer.Option("--port", help="TCP port (0: any free port).", rich_help_panel=MAIN)
]
DeviceOpt = Annotated[
    str,
    typer.Option(
        "--device", help="torch engine: cpu, cuda, cuda:N or auto.", rich_help_panel=ENGINE
    ),
]
DtypeOpt = Annotated[
    str,
    typer.Option(
        "--dtype",
        help="torch engine: float32, bfloat16, float16 or float64.",
        rich_help_panel=ENGINE,
    ),
]
ServedNameOpt = Annotated[
    str | None,
    typer.Option(
        "--served-model-name",
        help="Model id in /v1/models and requests.",
        show_default="the target's folder name",
        rich_help_panel=OUTPUT,
    ),
]
LogLevelOpt = Annotated[
    str,
    typer.Option(
        "--log-level",
        help="Server log level: debug, info, warning or error.",
        rich_help_panel=OUTPUT,
    ),
]
# Unset, the embedded engine's values (spectool.cli.serve_torch), or --engine-config's.
ServeMaxDraftLenOpt = option(
    MaxDraftLenOpt, default=f"the config's, else {TORCH_DEFAULT_MAX_DRAFT_LEN}"
)
ServeMaxBatchOpt = option(MaxBatchOpt, default=f"the config's, else {TORCH_DEFAULT_MAX_BATCH_SIZE}")
ServeMaxSeqOpt = option(MaxSeqOpt, default=f"the config's, else {TORCH_DEFAULT_MAX_SEQ_LEN}")


def _build_dir(target: str | None) -> Path | None:
    """``target`` when it names a folder written by ``spectool build`` (it has a manifest)."""
    from spectool.deploy.manifest import MANIFEST_NAME

    if target is None:
        return None
    path = Path(os.path.expanduser(target))
    return path if (path / MANIFEST_NAME).is_file() else None


class _PassThroughCommand(SpectoolCommand):
    """Keeps everything after ``--`` out of spectool's own parsing (``ctx.meta["passthrough"]``)
    so those arguments reach the server child unchanged."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta["passthrough"] = args[cut + 1 :]
            args = args[:cut]
        return super().parse_args(ctx, args)


def serve(
    ctx: typer.Context,
    target: TargetArg = None,
    drafter: DrafterArg = None,
    engine: EngineOpt = None,
    method: ServeMethodOpt = "auto",
    max_draft_len: ServeMaxDraftLenOpt = None,
    max_batch_size: ServeMaxBatchOpt = None,
    max_seq_len: ServeMaxSeqOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    served_model_name: ServedNameOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    log_level: LogLevelOpt = "info",
    speculation: SpeculationOpt = "auto",
    expected_concurrency: ExpectedConcurrencyOpt = None,
    expected_rate: ExpectedRateOpt = None,
    ready_timeout: ReadyTimeoutOpt = None,
    launcher: LauncherOpt = "local",
    max_concurrency: MaxConcurrencyOpt = None,
    draft_len_schedule: DraftLenScheduleOpt = None,
    engine_config: EngineConfigOpt = None,
    threads: ServeThreadsOpt = None,
) -> None:
    """Serve an OpenAI-compatible API (/v1/completions, /v1/chat/completions, /metrics).

    TARGET may be a build folder from spectool build: served as built (TensorRT-LLM or the
    embedded engine), speculation gated by the build's tune decision, arguments after -- passed
    to the server.

    Binds 127.0.0.1 unless --host says otherwise; Ctrl-C stops it cleanly.
    """
    if engine is not None and engine not in ENGINES:
        raise BadInputError("--engine", f"expected one of {', '.join(ENGINES)}, got {engine!r}")
    passthrough: list[str] = list(ctx.meta.get("passthrough", []))
    build_dir = _build_dir(target)
    if build_dir is not None:
        _refuse_build_time_options(ctx, drafter)
        if engine_config is not None:
            raise BadInputError("--engine-config", "a build folder chooses its own config file")
        code = _serve_build(
            build_dir,
            engine=engine,
            speculation=speculation,
            expected_concurrency=expected_concurrency,
            expected_rate=expected_rate,
            host=host,
            port=port,
            ready_timeout_s=ready_timeout,
            launcher=launcher,
            passthrough=passthrough,
            torch_flags=_forwarded_torch_flags(
                ctx, device, dtype, served_model_name, log_level, threads
            ),
        )
        raise typer.Exit(code)
    if engine == "trtllm":
        raise BadInputError(
            "--engine trtllm",
            "serves a build folder: run spectool build TARGET [DRAFTER] --out DIR, then "
            "spectool serve DIR",
        )
    if passthrough:
        raise BadInputError(
            "--", "extra server arguments need a build folder (spectool serve DIR -- ...)"
        )
    for name in (
        "speculation",
        "expected_concurrency",
        "expected_rate",
        "ready_timeout",
        "launcher",
    ):
        if _given(ctx, name):
            raise BadInputError(
                f"--{name.replace('_', '-')}", "applies to a build folder (spectool serve DIR)"
            )
    config_fields = None
    if engine_config is not None:
        from spectool.deploy.engine_config import read_engine_config

        for name in _BUILD_TIME:
            if _given(ctx, name):
                raise BadInputError(
                    f"--{name.replace('_', '-')}", f"is set by --engine-config {engine_config}"
                )
        config_fields = read_engine_config(engine_config)
    request = torch_serve_request(
        target,
        drafter,
        method=method,
        max_draft_len=max_draft_len,
        max_batch_size=max_batch_size,
        max_seq_len=max_seq_len,
        device=device,
        dtype=dtype,
        served_model_name=served_model_name,
        host=host,
        port=port,
        log_level=log_level,
        max_concurrency=max_concurrency,
        draft_len_schedule=draft_len_schedule,
        engine_config=config_fields,
        threads=threads,
    )
    serve_torch(request)


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` was typed on the command line (not left at its default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


# Options a build folder fixes at build time.
_BUILD_TIME = (
    "method",
    "max_draft_len",
    "max_batch_size",
    "max_seq_len",
    "max_concurrency",
    "draft_len_schedule",
)


def _refuse_build_time_options(ctx: typer.Context, drafter: str | None) -> None:
    if drafter is not None:
        raise BadInputError(
            "DRAFTER", "a build folder names its models; pass server arguments after --"
        )
    for name in _BUILD_TIME:
        if _given(ctx, name):
            raise BadInputError(
                f"--{name.replace('_', '-')}", "is fixed by the build folder; rebuild to change it"
            )


def _forwarded_torch_flags(
    ctx: typer.Context,
    device: str,
    dtype: str,
    served_model_name: str | None,
    log_level: str,
    threads: int | None = None,
) -> list[str]:
    """The embedded-engine flags given on this command line, for the server child."""
    flags: list[str] = []
    for name, value in (
        ("device", device),
        ("dtype", dtype),
        ("served_model_name", served_model_name),
        ("log_level", log_level),
        ("threads", threads),
    ):
        if _given(ctx, name):
            flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags


def _serve_build(
    build_dir: Path,
    *,
    engine: str | None,
    speculation: str,
    expected_concurrency: int | None,
    expected_rate: float | None,
    host: str,
    port: int,
    ready_timeout_s: float | None,
    launcher: str,
    passthrough: list[str],
    torch_flags: list[str],
) -> int:
    """Serve a build folder as a supervised child; the exit code (0, or 130 after Ctrl-C)."""
    import signal

    from spectool.deploy.launch import prepare_serve
    from spectool.deploy.manifest import read_manifest
    from spectool.deploy.supervise import ChildSpec, check_port_free, free_port, run_supervised

    if not 0 <= port <= 65535:
        raise BadInputError("--port", f"must be in 0..65535, got {port}")
    if launcher not in LAUNCHERS:
        raise BadInputError(
            "--launcher", f"expected one of {', '.join(LAUNCHERS)}, got {launcher!r}"
        )
    built_for = read_manifest(build_dir).engine
    if launcher != "local" and built_for != "trtllm":
        raise BadInputError(
            "--launcher",
            f"{launcher} launches TensorRT-LLM builds; {build_dir} "
            f"was built for engine {built_for}",
        )
    if built_for == "trtllm" and torch_flags:
        raise BadInputError(
            torch_flags[0],
            "applies to the embedded engine; pass trtllm-serve options after --",
        )
    if port == 0:
        port = free_port(host)
    check_port_free(host, port)  # a busy port fails before any "serving" line
    plan = prepare_serve(
        build_dir,
        engine=engine,
        speculation=speculation,
        expected_concurrency=expected_concurrency,
        expected_rate=expected_rate,
        host=host,
        port=port,
        extra=[*torch_flags, *passthrough],
        launcher=launcher,
    )
    for line in plan.warnings:
        typer.echo(f"spectool: warning: {line}", err=True)
    config = plan.command.config_file
    word = "with speculation" if plan.gate.speculate else "without speculation"
    level = "warning" if plan.gate.warn else "note"
    typer.echo(f"spectool: {level}: {plan.gate.reason}", err=True)
    typer.echo(  # one line: the command stays copyable
        f"spectool: serving {build_dir} {word} ({config}): {' '.join(plan.command.argv)}", err=True
    )
    name = "trtllm-serve" if plan.manifest.engine == "trtllm" else "spectool server"
    timeout_s = (
        ready_timeout_s if ready_timeout_s is not None else READY_TIMEOUT_S[plan.manifest.engine]
    )
    spec = ChildSpec(
        argv=plan.command.argv,
        name=name,
        host=host,
        port=port,
        ready_timeout_s=timeout_s,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )

    def ready(url: str, waited_s: float) -> None:
        typer.echo(f"spectool: ready after {waited_s:.1f} s: {url}/v1 (OpenAI API), {url}/metrics")

    if launcher == "slurm":
        from spectool.deploy.slurm import serve_build

        stopped = serve_build(
            plan,
            host=host,
            port=port,
            timeout_s=timeout_s,
            echo=lambda line: typer.echo(line, err=True),
            on_ready=ready,
        )
        return 130 if stopped == signal.SIGINT else 0

    if launcher == "mpirun":
        from spectool.deploy.mpirun import mpirun_child

        spec = mpirun_child(plan, spec)
        typer.echo(f"spectool: starting {' '.join(spec.argv)}", err=True)
    result = run_supervised(spec, on_output=lambda line: typer.echo(line, err=True), on_ready=ready)
    typer.echo(f"spectool: {name} stopped", err=True)
    return 130 if result.stop_signal == signal.SIGINT else 0


def register(app: typer.Typer) -> None:
    app.command("serve", cls=_PassThroughCommand)(serve)
