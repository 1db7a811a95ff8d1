"""Run the server app under uvicorn: bind (127.0.0.1 unless told otherwise), serve, stop cleanly.

spectool binds the listening socket itself before uvicorn starts, so a busy port is a
:class:`~spectool.errors.BadInputError` (exit 2) instead of uvicorn's ``sys.exit``, and port 0
picks a free port the caller can read back. uvicorn handles SIGINT and SIGTERM: it stops
accepting connections, lets in-flight requests finish for up to ``GRACEFUL_SHUTDOWN_S``, then
the app's shutdown stops the engine thread. A model that fails to load stops the server and is
raised again from :func:`serve`.

After a stop signal :func:`serve` decides the ending itself: SIGINT raises KeyboardInterrupt
(the CLI exits 130), SIGTERM returns (exit 0). uvicorn would instead re-raise the captured
signal from inside its event loop, where asyncio's runner may turn the KeyboardInterrupt into a
normal return, so the exit code depended on timing.
"""

from __future__ import annotations

import copy
import logging
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.config import LOGGING_CONFIG

from spectool.engine.engine import Engine, EngineConfig
from spectool.errors import BadInputError, EngineLoadError, SpectoolError
from spectool.server.app import ServerState, create_app

__all__ = [
    "DEFAULT_HOST",
    "bind_socket",
    "make_server",
    "serve",
    "serve_checkpoint",
    "serve_in_thread",
]

logger = logging.getLogger("spectool.server")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
GRACEFUL_SHUTDOWN_S = 5
# After a stop signal, requests in flight have this long to finish; the rest then end with an
# OpenAI error object (503, "server shutting down") well before uvicorn would cancel them.
DRAIN_S = 2.0
LISTEN_BACKLOG = 2048


def bind_socket(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: any free port; read it with getsockname)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise BadInputError(
            f"{host}:{port}", f"cannot listen there: {exc.strerror or exc}"
        ) from exc
    return sock


class HealthPollFilter(logging.Filter):
    """Drops uvicorn's access-log lines for ``GET /health``: supervisors and load balancers
    poll it every few seconds, which would bury the requests that matter."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (isinstance(args, tuple) and len(args) >= 3 and args[2] == "/health")


def _log_config(log_level: str) -> dict[str, Any]:
    """uvicorn's logging set-up plus the ``spectool`` logger (model loading, engine failures).

    Health polls are left out of the access log unless ``log_level`` is ``debug``."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["spectool"] = {
        "handlers": ["default"],
        "level": log_level.upper(),
        "propagate": False,
    }
    if log_level.lower() != "debug":
        config.setdefault("filters", {})["health_polls"] = {"()": HealthPollFilter}
        config["handlers"]["access"]["filters"] = ["health_polls"]
    return config


class _Server(uvicorn.Server):
    """uvicorn's server, remembering the first stop signal instead of re-raising it later."""

    stop_signal: int | None = None
    on_first_stop: Callable[[], None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.stop_signal is None:
            self.stop_signal = sig
            if self.on_first_stop is not None:
                self.on_first_stop()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: do not wait for requests in flight
        else:
            self.should_exit = True


def make_server(
    app: FastAPI, *, log_level: str = "info", access_log: bool = True
) -> uvicorn.Server:
    """A uvicorn server for ``app`` that stops by itself if the model fails to load."""
    config = uvicorn.Config(
        app,
        log_level=log_level,
        log_config=_log_config(log_level),
        access_log=access_log,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        backlog=LISTEN_BACKLOG,
    )
    server = _Server(config)
    state: ServerState = app.state.spectool

    def stop(_: BaseException) -> None:
        server.should_exit = True

    def end_in_flight() -> None:
        if state.driver is not None:
            state.driver.abort_all("server shutting down", after_s=DRAIN_S)

    state.on_load_error.append(stop)
    server.on_first_stop = end_in_flight
    return server


def serve_in_thread(
    app: FastAPI, *, name: str = "uvicorn", log_level: str = "warning"
) -> tuple[uvicorn.Server, threading.Thread, str]:
    """Start serving ``app`` on a free port of 127.0.0.1 in a daemon thread (no signal
    handling there); returns the server (set ``should_exit`` to stop it), the thread and the
    base URL. Readiness is the caller's to wait for (``/health``)."""
    sock = bind_socket(DEFAULT_HOST, 0)
    port = sock.getsockname()[1]
    server = make_server(app, log_level=log_level, access_log=False)

    def run() -> None:
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return server, thread, f"http://{DEFAULT_HOST}:{port}"


def serve(
    app: FastAPI,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    log_level: str = "info",
    access_log: bool = True,
    sock: socket.socket | None = None,
) -> None:
    """Serve ``app`` until SIGINT/SIGTERM; blocks. Re-raises a model load failure.

    ``sock``: a socket already bound with :func:`bind_socket` (then ``host``/``port`` are unused),
    so a caller can report a busy port before it prints anything about serving."""
    if sock is None:
        sock = bind_socket(host, port)
    server = make_server(app, log_level=log_level, access_log=access_log)
    bound_host, bound_port = sock.getsockname()[:2]
    shown_host = f"[{bound_host}]" if ":" in bound_host else bound_host
    logger.info("listening on http://%s:%d (Ctrl-C to stop)", shown_host, bound_port)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    error = app.state.spectool.load_error
    if isinstance(error, SpectoolError):
        raise error
    if error is not None:
        raise EngineLoadError(f"model failed to load: {error}") from error
    if getattr(server, "stop_signal", None) == signal.SIGINT:
        raise KeyboardInterrupt


def serve_checkpoint(
    target: Path,
    drafter: Path | None = None,
    config: EngineConfig = EngineConfig(),  # noqa: B008 (frozen, safe to share)
    *,
    model_name: str,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    log_level: str = "info",
    sock: socket.socket | None = None,
    description: str | None = None,
) -> None:
    """Serve ``target`` (and ``drafter``) with the embedded engine on ``host:port`` (or on the
    bound ``sock``); blocks. ``description``: shown in ``/v1/models``."""
    app = create_app(
        lambda: Engine(target, drafter, config), model_name=model_name, description=description
    )
    serve(app, host=host, port=port, log_level=log_level, sock=sock)
