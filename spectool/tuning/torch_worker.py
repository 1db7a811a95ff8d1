"""The child process that hosts ``tune``'s embedded-engine servers, one configuration at a time.

Why a child process, and why one for all configurations: the load generator must not share a
Python interpreter (and its GIL) with the server it measures, or the client's per-chunk work
would slow the engine, and more so for the baseline, which streams one chunk per token. A fresh
``spectool serve`` per configuration would isolate as well but pays an interpreter start and a
torch import (seconds) at every switch; this worker imports once and then serves each
configuration with a fresh :class:`~spectool.engine.engine.Engine` and a fresh uvicorn server
(:func:`spectool.server.run.make_server`, the same app ``spectool serve`` runs) on a thread,
bound to ``127.0.0.1`` on a free port.

Protocol: one JSON object per line. The parent writes to the worker's stdin

* ``{"serve": {"target", "drafter", "config", "model_name"}}``: stop the current server, load
  the models with ``config`` (:class:`~spectool.engine.engine.EngineConfig` fields) and serve
  them; the answer is ``{"ready": {"url", "load_s"}}`` once ``/health`` answers 200, or
  ``{"error": "..."}``;
* ``{"stop": true}``: stop the current server; answer ``{"stopped": true}``.

Answers go to the worker's original stdout; everything else the worker prints (uvicorn and
engine logs) goes to stderr. End of stdin (the parent closed it, or died) stops the server and
exits, so the worker never outlives ``tune``.

Run as ``python -m spectool.tuning.torch_worker --threads N``; ``N`` torch intra-op threads
(the parent leaves a core to itself on small machines).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 30.0
_POLL_S = 0.02


@dataclass
class _Running:
    """A server of the worker: uvicorn's object, its thread and its app."""

    server: Any
    thread: threading.Thread
    app: Any
    url: str


def _start(spec: dict[str, Any]) -> _Running:
    """Serve ``spec`` on a free port of 127.0.0.1; returns once ``/health`` says 200."""
    from spectool.deploy.supervise import poll_health
    from spectool.engine.engine import Engine, EngineConfig
    from spectool.server.app import create_app
    from spectool.server.run import serve_in_thread

    target = Path(spec["target"])
    drafter = Path(spec["drafter"]) if spec.get("drafter") else None
    fields = dict(spec["config"])
    schedule = fields.get("draft_len_schedule")
    if schedule:
        fields["draft_len_schedule"] = {int(b): int(k) for b, k in schedule.items()}
    config = EngineConfig(**fields)  # ConfigError on anything the engine refuses
    # other methods' drafters the engine holds beside its own ({method: folder or null})
    alternatives = {
        m: Path(path) if path else None for m, path in (spec.get("alternatives") or {}).items()
    }
    app = create_app(
        lambda: Engine(target, drafter, config, alternatives=alternatives),
        model_name=spec["model_name"],
    )
    # log_level info: the spectool loggers' lines (load, draft-length switches) reach
    # server.log; there is no access log in the worker
    server, thread, url = serve_in_thread(app, name="tune-server", log_level="info")
    running = _Running(server, thread, app, url)
    state = app.state.spectool
    wait = poll_health(
        running.url + "/health",
        timeout_s=READY_TIMEOUT_S,
        interval_s=_POLL_S,
        exit_code=lambda: 1 if state.load_error is not None or not thread.is_alive() else None,
    )
    if wait.outcome == "ready":
        return running
    _stop(running)
    if state.load_error is not None:
        raise RuntimeError(f"model failed to load: {state.load_error}")
    if wait.outcome == "exited":
        raise RuntimeError("the server stopped before it was ready")
    raise RuntimeError(f"not ready after {READY_TIMEOUT_S:.0f} s ({wait.last})")


def _stop(running: _Running | None) -> None:
    """Stop a server and release its engine (and GPU memory, if any)."""
    if running is None:
        return
    running.server.should_exit = True
    running.thread.join(STOP_TIMEOUT_S)
    if running.thread.is_alive():
        running.server.force_exit = True
        running.thread.join(STOP_TIMEOUT_S)
    import gc

    running.app.state.spectool.driver = None
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover - the worker always has torch
        pass


def _log(text: str) -> None:
    import logging

    logging.getLogger("spectool.tuning.worker").info(text)


def _answer(out: TextIO, obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def serve_commands(commands: TextIO, answers: TextIO) -> None:
    """Read commands until end of input, answering each (see the module docstring)."""
    running: _Running | None = None
    try:
        for line in commands:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except json.JSONDecodeError as e:
                _answer(answers, {"error": f"malformed command: {e.msg}"})
                continue
            if "serve" in message:
                _stop(running)
                running = None
                started = time.perf_counter()
                try:
                    running = _start(message["serve"])
                except Exception as e:  # reported to the parent, which raises a typed error
                    _answer(answers, {"error": f"{type(e).__name__}: {e}"})
                    continue
                load_s = time.perf_counter() - started
                spec = message["serve"]
                _log(
                    f"serving {spec['target']}"
                    + (f" with drafter {spec['drafter']}" if spec.get("drafter") else "")
                    + f", {spec['config']}, at {running.url} (ready in {load_s:.1f} s)"
                )
                _answer(answers, {"ready": {"url": running.url, "load_s": load_s}})
            elif "stop" in message:
                _stop(running)
                running = None
                _answer(answers, {"stopped": True})
            else:
                _answer(answers, {"error": f"unknown command {sorted(message)}"})
    finally:
        _stop(running)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m spectool.tuning.torch_worker``."""
    parser = argparse.ArgumentParser(prog="spectool.tuning.torch_worker")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    args = parser.parse_args(argv)
    # Answers get a private copy of stdout; fd 1 then points at stderr, so nothing a library
    # prints can corrupt the protocol.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8", buffering=1)
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    # the server's own lines (loads, draft-length switches, warnings) go to stderr, which the
    # parent writes to DIR/server.log
    import logging

    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the /health polls: not worth a line
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    serve_commands(sys.stdin, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
