"""Servers of spectool's embedded engine for ``tune``, in a worker process.

The worker (:mod:`spectool.tuning.torch_worker`) is one child process, started on the first
:meth:`TorchDriver.serve` in its own process group, that imports torch once. With
``max_draft_len`` (what ``tune`` uses) it serves one configuration holding the target and the
drafter at that length, and :meth:`TorchDriver.serve` then switches the running server's draft
length in place (``POST /spectool/draft_len``; 0 is the baseline with the drafter idle): no
restart between the speculative and baseline blocks ``tune`` interleaves. Without it, one server
per configuration: the baseline (``method="none"``, no drafter) for ``k = 0``, otherwise the
method at a fixed ``k``. Every configuration shares the batch and sequence limits, device, dtype
and torch thread count, so the only difference a trial sees is speculation. Worker and server
logs go to ``DIR/server.log``.

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

from spectool import methods
from spectool.deploy import supervise
from spectool.errors import ChildProcessError_
from spectool.tuning.driver import ServerInfo

WORKER_MODULE = "spectool.tuning.torch_worker"
DEFAULT_READY_TIMEOUT_S = 600.0
SWITCH_TIMEOUT_S = 30.0
METRICS_PATH = "/spectool/iterations?after={after}"  # paged by iteration number, not drained


def default_threads() -> int:
    """torch threads for the server: every core but one (left to the load generator), >= 1."""
    return max(1, (os.cpu_count() or 2) - 1)


class TorchDriver:
    """Embedded-engine servers at any ``k``; see the module docstring."""

    engine = "torch"
    interleaves = True

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
        max_draft_len: int | None = None,
        alternatives: dict[str, Path | None] | None = None,
        draft_len_schedule: dict[int, int] | None = None,
    ) -> None:
        self.target = target
        # the deployment's schedule (batch size -> k, upper bounds): the switching server loads
        # it, and serve_deployed() decodes as it says, batch by batch (tune's rate levels)
        self.draft_len_schedule = dict(draft_len_schedule) if draft_len_schedule else None
        # other methods the switching server holds beside ``method`` ({method: drafter or
        # None}): serve(k, method=...) switches between them in place (tune compares methods)
        self.alternatives = dict(alternatives or {})
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
        self.max_draft_len = max_draft_len
        self._url: str | None = None  # the switching server, once started
        self._proc: subprocess.Popen[Any] | None = None
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._current: ServerInfo | None = None
        self._arm: tuple[str, int] | None = None  # (method, k) the server decodes with now
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
        if self.draft_len_schedule:
            common["draft_len_schedule"] = {str(b): v for b, v in self.draft_len_schedule.items()}
        return {"method": self.method, "max_draft_len": k, **common}

    # -- the worker -------------------------------------------------------------------------

    def _start_worker(self) -> subprocess.Popen[Any]:
        argv = [sys.executable, "-m", WORKER_MODULE, "--threads", str(self.threads)]
        proc = supervise.spawn(
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
            raise supervise.log_failure(
                "the engine worker", "stopped unexpectedly", self.log_path
            ) from None
        try:
            line = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            raise supervise.log_failure(
                "the engine worker",
                f"did not answer within {timeout_s:.0f} s (raise --ready-timeout if loading is slow)",
                self.log_path,
            ) from None
        if line is None:
            raise supervise.log_failure("the engine worker", "exited unexpectedly", self.log_path)
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            raise ChildProcessError_(f"the engine worker answered {line.strip()!r}") from None
        return answer

    # -- ServerDriver -----------------------------------------------------------------------

    def serve(self, k: int, method: str | None = None) -> ServerInfo:
        """A server decoding at draft length ``k`` (with ``method``: one of ``alternatives``,
        or the driver's own method; None: the driver's own).

        With ``max_draft_len`` set, one server holds the target and the drafter (and the
        alternatives' drafters) and switches its draft length and method in place
        (``POST /spectool/draft_len``; 0 = speculation off, the drafters idle): no restart
        between the blocks ``tune`` interleaves. Without it, one server per configuration
        (the baseline without a drafter for ``k = 0``).
        """
        method = method or self.method
        if method != self.method and method not in self.alternatives:
            raise ValueError(f"method {method!r} is not held by this driver")
        arm = (method if k > 0 else "none", k)
        if self._current is not None and self._arm == arm:
            return ServerInfo(self._current.base_url, self.model_name, k, 0.0, METRICS_PATH)
        if self.max_draft_len is not None and k > self.max_draft_len:
            raise ValueError(f"k={k} is above the server's max_draft_len {self.max_draft_len}")
        if self.max_draft_len is not None and self._url is not None:
            self._switch(self._url, k, method)
            self._current = ServerInfo(self._url, self.model_name, k, 0.0, METRICS_PATH)
            self._arm = arm
            return self._current
        if method != self.method:
            raise ValueError("switching methods needs a switching server (max_draft_len)")
        self._current = None
        switching = self.max_draft_len is not None
        load_k = self.max_draft_len if switching else k
        assert load_k is not None
        spec = {
            "target": str(self.target),
            "drafter": (
                str(self.drafter)
                if (load_k > 0 and methods.get(self.method).takes_drafter)
                else None
            ),
            "config": self.engine_config(load_k),
            "model_name": self.model_name,
        }
        if switching and self.alternatives:
            spec["alternatives"] = {
                m: None if path is None else str(path) for m, path in self.alternatives.items()
            }
        answer = self._ask({"serve": spec}, self.ready_timeout_s)
        if "ready" not in answer:
            raise supervise.log_failure(
                "the engine worker",
                f"could not serve k={load_k}: {answer.get('error', answer)}",
                self.log_path,
            )
        self.starts += 1
        ready = answer["ready"]
        url = ready["url"]
        if switching:
            self._url = url
            self._switch(url, k, method)
        self._current = ServerInfo(url, self.model_name, k, float(ready["load_s"]), METRICS_PATH)
        self._arm = arm
        return self._current

    def serve_deployed(self) -> ServerInfo:
        """The switching server decoding as deployed: its ``draft_len_schedule`` applied at
        every step's batch size (``POST /spectool/draft_len {"k": null}``), not one fixed k."""
        if not self.draft_len_schedule or self.max_draft_len is None:
            raise ValueError("serving as deployed needs a switching server with a schedule")
        if self._arm == (self.method, -1) and self._url is not None:
            return ServerInfo(self._url, self.model_name, self.max_draft_len, 0.0, METRICS_PATH)
        self.serve(self.max_draft_len)
        assert self._url is not None
        self._switch(self._url, None)
        self._arm = (self.method, -1)
        return ServerInfo(self._url, self.model_name, self.max_draft_len, 0.0, METRICS_PATH)

    def for_method(self, method: str) -> MethodServer:
        """This driver's switching server seen as one method's driver (what a method's
        ``tune`` session drives when methods share one server)."""
        return MethodServer(self, method)

    def _switch(self, url: str, k: int | None, method: str | None = None) -> None:
        """Set the running server's draft length; waits out requests still finishing."""
        import time

        import httpx

        from spectool.measure.client import tls_context

        deadline = time.monotonic() + SWITCH_TIMEOUT_S
        while True:
            try:
                body: dict[str, Any] = {"k": k}
                if self.alternatives and k and method is not None:
                    body["method"] = method
                response = httpx.post(
                    url + "/spectool/draft_len", json=body, timeout=30.0, verify=tls_context()
                )
            except httpx.HTTPError as exc:
                raise supervise.log_failure(
                    "the engine worker", f"did not switch to k={k}: {exc}", self.log_path
                ) from None
            if response.status_code == 200:
                return
            if response.status_code != 409 or time.monotonic() > deadline:
                raise supervise.log_failure(
                    "the engine worker",
                    f"refused k={k}: HTTP {response.status_code} {response.text[:200]}",
                    self.log_path,
                )
            time.sleep(0.05)  # requests of the last block are still finishing

    def close(self) -> None:
        """Close the worker's stdin (it stops its server and exits), then stop its group."""
        proc, self._proc, self._current, self._url = self._proc, None, None, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=supervise.STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        supervise.stop(proc)

    def __enter__(self) -> TorchDriver:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class MethodServer:
    """One method's view of a :class:`TorchDriver` whose server holds several methods:
    ``serve(k)`` switches the shared server to this method at ``k``. Closing it closes
    nothing (the shared driver's owner does)."""

    engine = "torch"
    interleaves = True

    def __init__(self, shared: TorchDriver, method: str) -> None:
        self.shared = shared
        self.method = method

    @property
    def starts(self) -> int:
        return self.shared.starts

    def serve(self, k: int) -> ServerInfo:
        return self.shared.serve(k, self.method)

    def close(self) -> None:
        pass

    def __enter__(self) -> MethodServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        pass
