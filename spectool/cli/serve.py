"""``spectool serve``: an OpenAI-compatible server for a target (and drafter).

``--engine torch`` serves with spectool's embedded PyTorch engine (CPU or CUDA); with no TARGET
it serves the embedded demo pair. The command parses and checks its options, then hands one
:class:`TorchServeRequest` to the library; the TensorRT-LLM path (``--engine trtllm``) plugs in
beside :func:`_serve_torch` with its own request. fastapi, uvicorn and torch are imported only
inside the command body so that ``spectool --help`` stays fast.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from spectool.cli.options import DrafterArg, MaxBatchOpt, MaxDraftLenOpt, MaxSeqOpt, TargetArg
from spectool.errors import BadInputError, CheckpointError

ENGINES = ("torch", "trtllm")
TORCH_METHODS = ("auto", "draft_model", "ngram", "none")
DEMO_TARGET = "spectool:demo-target"
DEMO_DRAFTER = "spectool:demo-drafter"
TORCH_DEFAULT_MAX_BATCH_SIZE = 32
TORCH_DEFAULT_MAX_SEQ_LEN = 1024
TORCH_DEFAULT_MAX_DRAFT_LEN = 4

EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="torch: spectool's embedded PyTorch engine (CPU/CUDA). trtllm: not in this build yet.",
    ),
]
ServeMethodOpt = Annotated[
    str,
    typer.Option(
        "--method",
        help="torch engine: auto|draft_model|ngram|none (auto: draft_model with a drafter, else none).",
    ),
]
HostOpt = Annotated[
    str, typer.Option("--host", help="Address to listen on (127.0.0.1: this machine only).")
]
PortOpt = Annotated[int, typer.Option("--port", help="TCP port (0: any free port).")]
DeviceOpt = Annotated[
    str, typer.Option("--device", help="torch engine: cpu, cuda, cuda:N or auto.")
]
DtypeOpt = Annotated[
    str, typer.Option("--dtype", help="torch engine: float32, bfloat16, float16 or float64.")
]
ServedNameOpt = Annotated[
    str | None,
    typer.Option(
        "--served-model-name",
        help="Model id in /v1/models and requests (default: the target's folder name).",
    ),
]
LogLevelOpt = Annotated[
    str, typer.Option("--log-level", help="Server log level: debug|info|warning|error.")
]


@dataclass(frozen=True)
class TorchServeRequest:
    """Everything the embedded-engine server needs, checked: folders, engine config, address."""

    target: Path
    drafter: Path | None
    method: str
    max_draft_len: int
    max_batch_size: int
    max_seq_len: int
    device: str
    dtype: str
    model_name: str
    host: str
    port: int
    log_level: str


def _local_folder(ref: str, role: str) -> Path:
    """A checkpoint folder for the embedded engine: ``spectool:NAME`` or a local folder."""
    from spectool.ckpt.refs import BUILTIN_PREFIX, builtin_path

    if ref.startswith(BUILTIN_PREFIX):
        return builtin_path(ref[len(BUILTIN_PREFIX) :])
    path = Path(os.path.expanduser(ref))
    if not path.exists():
        raise CheckpointError(
            ref,
            f"no such folder; the torch engine serves a local {role} folder or spectool:NAME",
        )
    if not path.is_dir():
        raise CheckpointError(ref, "is a file; pass the checkpoint folder")
    return path.resolve()


def torch_serve_request(
    target: str | None,
    drafter: str | None,
    *,
    method: str = "auto",
    max_draft_len: int | None = None,
    max_batch_size: int | None = None,
    max_seq_len: int | None = None,
    device: str = "auto",
    dtype: str = "float32",
    served_model_name: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
) -> TorchServeRequest:
    """Check the options and resolve the models (no TARGET: the embedded demo pair)."""
    if method not in TORCH_METHODS:
        raise BadInputError("--method", f"the torch engine runs {', '.join(TORCH_METHODS)}")
    if target is None:
        if drafter is not None:
            raise BadInputError("DRAFTER", "a drafter needs a TARGET")
        target = DEMO_TARGET
        drafter = DEMO_DRAFTER if method in ("auto", "draft_model") else None
    if method == "auto":
        method = "draft_model" if drafter is not None else "none"
    if drafter is not None and method != "draft_model":
        raise BadInputError("--method", f"{method!r} uses no drafter; drop DRAFTER")
    if method == "draft_model" and drafter is None:
        raise BadInputError("--method", "draft_model needs a DRAFTER")
    if not 0 <= port <= 65535:
        raise BadInputError("--port", f"must be in 0..65535, got {port}")
    target_path = _local_folder(target, "target")
    drafter_path = _local_folder(drafter, "drafter") if drafter is not None else None
    if served_model_name is None:
        served_model_name = target_path.name
    return TorchServeRequest(
        target=target_path,
        drafter=drafter_path,
        method=method,
        max_draft_len=TORCH_DEFAULT_MAX_DRAFT_LEN if max_draft_len is None else max_draft_len,
        max_batch_size=TORCH_DEFAULT_MAX_BATCH_SIZE if max_batch_size is None else max_batch_size,
        max_seq_len=TORCH_DEFAULT_MAX_SEQ_LEN if max_seq_len is None else max_seq_len,
        device=device,
        dtype=dtype,
        model_name=served_model_name,
        host=host,
        port=port,
        log_level=log_level,
    )


def serve(
    target: TargetArg = None,
    drafter: DrafterArg = None,
    engine: EngineOpt = "torch",
    method: ServeMethodOpt = "auto",
    max_draft_len: MaxDraftLenOpt = None,
    max_batch_size: MaxBatchOpt = None,
    max_seq_len: MaxSeqOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    served_model_name: ServedNameOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    log_level: LogLevelOpt = "info",
) -> None:
    """Serve an OpenAI-compatible API (/v1/completions, /v1/chat/completions, /metrics).

    Binds 127.0.0.1 unless --host says otherwise; Ctrl-C stops it cleanly.
    """
    if engine not in ENGINES:
        raise BadInputError("--engine", f"expected one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "trtllm":
        raise BadInputError(
            "--engine trtllm", "not available in this build yet; use --engine torch"
        )
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
    )
    _serve_torch(request)


def _serve_torch(request: TorchServeRequest) -> None:
    from spectool.engine.engine import EngineConfig
    from spectool.server.run import serve_checkpoint

    config = EngineConfig(  # validated here: a bad option fails before the server starts
        method=request.method,
        max_draft_len=request.max_draft_len,
        max_batch_size=request.max_batch_size,
        max_seq_len=request.max_seq_len,
        device=request.device,
        dtype=request.dtype,
    )
    drafting = f", {request.method} k={request.max_draft_len}" if request.method != "none" else ""
    drafter = f" + {request.drafter.name}" if request.drafter is not None else ""
    typer.echo(
        f"spectool: serving {request.model_name} ({request.target.name}{drafter}{drafting}) "
        f"with the torch engine on {request.device}, address {request.host}:{request.port}",
        err=True,
    )
    serve_checkpoint(
        request.target,
        request.drafter,
        config,
        model_name=request.model_name,
        host=request.host,
        port=request.port,
        log_level=request.log_level,
    )


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
