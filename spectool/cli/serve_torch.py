"""``spectool serve`` on the embedded engine: options checked into a :class:`TorchServeRequest`,
then the server in this process.

The engine settings come from flags (``--method``, ``--max-draft-len``, ...) or, for a build
folder's child, from the build's config file itself (``--engine-config DIR/speculative.json``,
read by :func:`spectool.deploy.engine_config.read_engine_config`; no flag round trip). Torch
is imported only when the server starts.
"""

from __future__ import annotations

import os
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from spectool import methods
from spectool.errors import BadInputError, CheckpointError
from spectool.inputs import MAX_DRAFT_LEN, check_range
from spectool.suggest import suggestion

# The methods the embedded engine runs, ``none`` included (spectool.methods).
TORCH_METHODS = ("auto", *methods.engine_methods("torch", baseline=True))
DEMO_TARGET = "spectool:demo-target"
DEMO_DRAFTER = "spectool:demo-drafter"
# Said once at start-up and in /v1/models when the target is the demo model: a newcomer who
# chats with it gets lines of "#" and would otherwise think the server broken.
DEMO_NOTE = (
    "demo-target is a tiny model trained on Python standard-library code, for measuring speed, "
    "not for answers: it continues code, and to a chat message it answers lines like '#'"
)
TORCH_DEFAULT_MAX_BATCH_SIZE = 32
TORCH_DEFAULT_MAX_SEQ_LEN = 1024
TORCH_DEFAULT_MAX_DRAFT_LEN = 4


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
    max_concurrency: int | None = None
    draft_len_schedule: dict[int, int] | None = None
    default_pair: bool = False  # no TARGET given: spectool's demo pair
    threads: int | None = None  # torch intra-op threads (None: all cores but one, as tune)


def _local_folder(ref: str, role: str, kind_expected: str | None = methods.CAUSAL_LM) -> Path:
    """A checkpoint folder for the embedded engine: ``spectool:NAME`` or a local folder holding
    ``kind_expected`` weights (None: any kind, the caller checks)."""
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
    return _servable(path.resolve(), ref, role, kind_expected)


def _servable(
    path: Path, ref: str, role: str, kind_expected: str | None = methods.CAUSAL_LM
) -> Path:
    """``path`` when it holds a model the embedded engine can load: checked before any server
    starts (config fields, weight headers, a causal LM), so a wrong folder is one line."""
    from spectool.ckpt.inspect import KIND_LABELS, inspect_folder
    from spectool.deploy.manifest import MANIFEST_NAME

    if not (path / "config.json").is_file():
        raise CheckpointError(
            ref,
            f"neither a build folder (no {MANIFEST_NAME}) nor a model folder (no config.json); "
            "nothing to serve",
        )
    kind = inspect_folder(path, ref).kind
    if kind_expected is not None and kind != kind_expected:
        raise CheckpointError(
            ref, f"holds {KIND_LABELS[kind]}, not a {role} model the torch engine can serve"
        )
    return path


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
    max_concurrency: int | None = None,
    draft_len_schedule: str | None = None,
    engine_config: dict[str, Any] | None = None,
    threads: int | None = None,
) -> TorchServeRequest:
    """Check the options and resolve the models (no TARGET: the embedded demo pair).

    ``engine_config``: EngineConfig fields read from a build's file (``--engine-config``); it
    then supplies the method, draft length, schedule and limits instead of the flags.
    """
    if threads is not None and threads < 1:
        raise BadInputError("--threads", f"must be >= 1, got {threads}")
    if engine_config is not None:
        method = str(engine_config["method"])
    if drafter == methods.SELF_DRAFTER:  # the target's own MTP layers, as check and build take
        drafter = None
        method = "mtp" if method == "auto" else method
    if method not in TORCH_METHODS:
        raise BadInputError(
            "--method",
            f"unknown method {method!r}{suggestion(method, TORCH_METHODS)}; the torch engine "
            f"runs {', '.join(TORCH_METHODS)}",
        )
    if engine_config is None:  # the same ranges as check, build and tune (spectool.inputs)
        check_range("--max-draft-len", max_draft_len, 1, MAX_DRAFT_LEN)
        check_range("--max-batch-size", max_batch_size)
        check_range("--max-seq-len", max_seq_len, 2)
    if target is None:
        if drafter is not None:
            raise BadInputError("DRAFTER", "a drafter needs a TARGET")
        target = DEMO_TARGET
        drafter = DEMO_DRAFTER if method in ("auto", "draft_model") else None
        default_pair = True
    else:
        default_pair = False
    if method == "auto":
        method = _auto_method(drafter)
    spec = methods.get(method)
    if drafter is not None and not spec.takes_drafter:
        raise BadInputError("--method", f"{method!r} uses no drafter; drop DRAFTER")
    if spec.takes_drafter and drafter is None:
        raise BadInputError("--method", f"{method} needs a DRAFTER")
    if not 0 <= port <= 65535:
        raise BadInputError("--port", f"must be in 0..65535, got {port}")
    target_path = _local_folder(target, "target")
    if spec.uses_native_layers:
        _check_native_layers(target_path, target)
    drafter_path = (
        _local_folder(drafter, "drafter", spec.drafter_kind or methods.CAUSAL_LM)
        if drafter is not None
        else None
    )
    if engine_config is not None:
        max_draft_len = engine_config.get("max_draft_len", 0)
        max_batch_size = engine_config["max_batch_size"]
        max_seq_len = engine_config["max_seq_len"]
        max_concurrency = engine_config.get("max_concurrency")
        schedule = engine_config.get("draft_len_schedule")
    else:
        schedule = parse_draft_len_schedule(draft_len_schedule)
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
        max_concurrency=max_concurrency,
        draft_len_schedule=schedule,
        default_pair=default_pair,
        threads=threads,
    )


def _check_native_layers(path: Path, ref: str) -> None:
    """Method mtp drafts with the target's own MTP module: one line before any server starts
    when its config declares none (or its weights hold none)."""
    from spectool.ckpt.inspect import inspect_folder

    ckpt = inspect_folder(path, ref)
    if not ckpt.mtp_layers:
        raise CheckpointError(
            ref,
            "declares no MTP layers (num_nextn_predict_layers) with MTP tensors in its weights; "
            "method mtp drafts with the target's own MTP module",
        )


def _auto_method(drafter: str | None) -> str:
    """``--method auto``: ``none`` without a drafter, else the method its weights call for, when
    the embedded engine runs it (spectool.methods)."""
    if drafter is None:
        return methods.NONE
    from spectool.ckpt.inspect import KIND_LABELS, inspect_folder

    path = _local_folder(drafter, "drafter", kind_expected=None)
    kind = inspect_folder(path, drafter).kind
    method = methods.METHOD_FOR_KIND.get(kind)
    if method is None or "torch" not in methods.get(method).engines:
        runs = ", ".join(methods.engine_methods("torch"))
        raise CheckpointError(
            drafter,
            f"holds {KIND_LABELS[kind]} ({method or 'no method'}); the torch engine drafts with "
            f"{runs}: pass a draft model of the target's tokenizer, or build for TensorRT-LLM",
        )
    return method


def parse_draft_len_schedule(text: str | None) -> dict[int, int] | None:
    """``"4:4,8:2"`` -> ``{4: 4, 8: 2}`` (batch size: draft length); None stays None."""
    if text is None:
        return None
    schedule: dict[int, int] = {}
    for item in text.split(","):
        batch, sep, k = item.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            schedule[int(batch)] = int(k)
        except ValueError:
            raise BadInputError(
                "--draft-len-schedule", f"expected batch:k pairs like 4:4,8:2, got {text!r}"
            ) from None
    return schedule


def serve_torch(request: TorchServeRequest) -> None:
    """Run the embedded-engine server for ``request`` in this process until stopped.

    torch runs ``request.threads`` intra-op threads, by default every core but one, as tune's
    servers do (:func:`spectool.tuning.torch_driver.default_threads`): the deployment then runs
    as it was measured, and a core is left to the HTTP loop. torch's own default (every core)
    busy-waits its threads between operations; beside a client or another server on the same
    cores it slowed a demo baseline's decode steps from 6 ms to over 100 ms.
    """
    import torch

    from spectool.engine.engine import EngineConfig
    from spectool.server.run import bind_socket, serve_checkpoint
    from spectool.tuning.torch_driver import default_threads

    torch.set_num_threads(request.threads or default_threads())

    config = EngineConfig(  # validated here: a bad option fails before the server starts
        method=request.method,
        max_draft_len=request.max_draft_len,
        max_batch_size=request.max_batch_size,
        max_seq_len=request.max_seq_len,
        device=request.device,
        dtype=request.dtype,
        max_concurrency=request.max_concurrency,
        draft_len_schedule=request.draft_len_schedule,
    )
    drafting = f", {request.method} k={request.max_draft_len}" if request.method != "none" else ""
    drafter = f" + {request.drafter.name}" if request.drafter is not None else ""
    description = demo_description(request.target)
    if request.default_pair:
        _say(
            "spectool: note: no TARGET given: serving spectool's demo pair "
            f"({DEMO_TARGET} + {DEMO_DRAFTER}) on the embedded torch engine, the engine that "
            "serves a model folder directly (TensorRT-LLM serves build folders: spectool build "
            f"TARGET [DRAFTER] --out DIR, then spectool serve DIR); {DEMO_NOTE}"
        )
    elif description is not None:
        _say(f"spectool: note: {DEMO_NOTE}")
    sock = bind_socket(request.host, request.port)  # a busy port fails before the line below
    bound_host, bound_port = sock.getsockname()[:2]
    _say(
        f"spectool: serving {request.model_name} ({request.target.name}{drafter}{drafting}) "
        f"with the torch engine on {request.device}, address {bound_host}:{bound_port}"
    )
    serve_checkpoint(
        request.target,
        request.drafter,
        config,
        model_name=request.model_name,
        host=request.host,
        port=request.port,
        log_level=request.log_level,
        sock=sock,
        description=description,
    )


def demo_description(target: Path) -> str | None:
    """:data:`DEMO_NOTE` when ``target`` is spectool's demo model, else None."""
    from spectool.ckpt.refs import BUILTIN_PREFIX, builtin_path

    demo = builtin_path(DEMO_TARGET.removeprefix(BUILTIN_PREFIX))
    return DEMO_NOTE if target.resolve() == demo.resolve() else None


def _say(text: str) -> None:
    """A line for stderr, wrapped at the terminal's width (80 when unknown) between words, so
    paths, flags and addresses are never cut in two."""
    width = shutil.get_terminal_size((80, 24)).columns
    lines = textwrap.wrap(
        text, width=max(width, 40), subsequent_indent="  ", break_long_words=False,
        break_on_hyphens=False,
    )  # fmt: skip
    typer.echo("\n".join(lines), err=True)
