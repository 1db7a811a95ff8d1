"""Servers of spectool's embedded engine for ``tune``: one per configuration, in a worker process.

The worker (:mod:`spectool.tuning.torch_worker`) is one child process, started on the first
:meth:`TorchDriver.serve` in its own process group, that imports torch once and serves one
configuration at a time: the baseline (``method="none"``, no drafter) for ``k = 0``, otherwise
the method at a fixed draft length ``k`` (no schedule). Every configuration shares the batch and
sequence limits, device, dtype and torch thread count, so the only difference a trial sees is
speculation. Worker and server logs go to ``DIR/server.log``.

Why a separate process rather than uvicorn on a thread of ``tune``: the load generator would
share the GIL with the engine it times (see the worker's docstring). The worker exits by itself
when ``tune`` closes its stdin or dies, and :meth:`TorchDriver.close` stops its process group,
so no server outlives ``tune``.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from spectool.errors import ChildProcessError_
from spectool.tuning import child
from spectool.tuning.driver import ServerInfo

WORKER_MODULE = "spectool.tuning.torch_worker"
DEFAULT_READY_TIMEOUT_S = 600.0


def default_threads() -> int:
    """torch threads for the server: every core but one (left to the load generator), >= 1."""
    return max(1, (os.cpu_count() or 2) - 1)


class TorchDriver:
    """Embedded-engine servers at any ``k``; see the module docstring."""

    engine = "torch"

    def __init__(
        self,
        target: Path,
        drafter: Path | None,
        method: str,
        *,
        model_name: str,
        max_batch_size: int,
        max_seq_len: int,
        device: str,
        dtype: str,
        threads: int,
        log_path: Path,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.method = method
        self.model_name = model_name
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.device = device
        self.dtype = dtype
        self.threads = threads
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self._proc: subprocess.Popen[Any] | None = None
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._current: ServerInfo | None = None
        self.starts = 0

    # -- configurations ---------------------------------------------------------------------

    def engine_config(self, k: int) -> dict[str, Any]:
        """EngineConfig fields for draft length ``k`` (0: the baseline)."""
        common = {
            "max_batch_size": self.max_batch_size,
            "max_seq_len": self.max_seq_len,
            "device": self.device,
            "dtype": self.dtype,
        }
        if k == 0:
            return {"method": "none", "max_draft_len": 0, **common}
        return {"method": self.method, "max_draft_len": k, **common}

    # -- the worker -------------------------------------------------------------------------

    def _start_worker(self) -> subprocess.Popen[Any]:
        argv = [sys.executable, "-m", WORKER_MODULE, "--threads", str(self.threads)]
        proc = child.spawn(
            argv,
            name="the engine worker",
            log_path=self.log_path,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None

        def pump(stream: Any) -> None:
            for raw in iter(stream.readline, b""):
                self._answers.put(raw.decode("utf-8", errors="replace"))
            self._answers.put(None)  # end of output: the worker exited

        threading.Thread(
            target=pump, args=(proc.stdout,), name="worker-answers", daemon=True
        ).start()
        return proc

    def _ask(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start_worker()
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write((json.dumps(message) + "\n").encode("utf-8"))
            self._proc.stdin.flush()
        except OSError:
            raise child.failure(
                "the engine worker", "stopped unexpectedly", self.log_path
            ) from None
        try:
            line = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            raise child.failure(
                "the engine worker",
                f"did not answer within {timeout_s:.0f} s (raise --ready-timeout if loading is slow)",
                self.log_path,
            ) from None
        if line is None:
            raise child.failure("the engine worker", "exited unexpectedly", self.log_path)
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            raise ChildProcessError_(f"the engine worker answered {line.strip()!r}") from None
        return answer

    # -- ServerDriver -----------------------------------------------------------------------

    def serve(self, k: int) -> ServerInfo:
        """A server running draft length ``k``; the running one is replaced when ``k`` differs."""
        if self._current is not None and self._current.k == k:
            return ServerInfo(self._current.base_url, self.model_name, k, 0.0)
        self._current = None
        spec = {
            "target": str(self.target),
            "drafter": str(self.drafter) if (k > 0 and self.method == "draft_model") else None,
            "config": self.engine_config(k),
            "model_name": self.model_name,
        }
        answer = self._ask({"serve": spec}, self.ready_timeout_s)
        if "ready" not in answer:
            raise child.failure(
                "the engine worker",
                f"could not serve k={k}: {answer.get('error', answer)}",
                self.log_path,
            )
        self.starts += 1
        ready = answer["ready"]
        self._current = ServerInfo(ready["url"], self.model_name, k, float(ready["load_s"]))
        return self._current

    def close(self) -> None:
        """Close the worker's stdin (it stops its server and exits), then stop its group."""
        proc, self._proc, self._current = self._proc, None, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=child.STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        child.stop(proc)

    def __enter__(self) -> TorchDriver:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
