"""Every server child spectool starts, in one place: own process group, output to a pipe or a
log file, readiness on ``/health``, teardown of the whole group.

Two users: ``spectool serve`` (:func:`run_supervised`: one server, its output streamed to the
terminal, until the user stops it) and ``tune``'s drivers (:func:`spawn` with a ``log_path``,
:func:`wait_healthy`, :func:`stop`: one server per configuration, started and stopped apart,
measured in between, output appended to a log file in the tune folder, never to a pipe nobody
reads). Both start with :func:`spawn` and stop with :func:`stop_group`.

Why a supervisor: ``trtllm-serve`` takes minutes to load, may spawn worker processes (MPI ranks,
post-processing workers), and dies with its reason in the log. The child starts in its own
session (so its own process group): a Ctrl-C in the terminal reaches spectool only, which forwards
SIGINT/SIGTERM to the whole group; on every way out (ready timeout, crash, signal, an exception in
spectool) the group gets SIGTERM, then SIGKILL after a grace period, until it is empty.

Exit codes the caller maps: the child failing to start, dying or not becoming ready raises
:class:`~spectool.errors.ChildProcessError_` (exit 3) carrying the log tail (the pipe's last
lines, or the log file's); a busy port is a
:class:`~spectool.errors.BadInputError` (exit 2) raised before anything starts. A stop the user
asked for (SIGINT/SIGTERM) returns normally with the signal number.

Limitations: signals are forwarded only when the supervisor runs in the main thread (Python
delivers them there); if spectool itself is killed with SIGKILL it cannot clean up, and the child
keeps running in its own session (stop it with ``kill -- -PGID``).
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

import httpx

from spectool.errors import BadInputError, ChildProcessError_

TAIL_LINES = 40
STOP_GRACE_S = 15.0
POLL_INTERVAL_S = 0.25
TAIL_DRAIN_S = 2.0
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)

OutputFn = Callable[[str], None]


@dataclass(frozen=True)
class ChildSpec:
    """A server child: ``argv`` (no shell), its listening address and how long to wait for
    ``GET http://host:port{health_path}`` to answer 200. ``name`` is used in messages."""

    argv: tuple[str, ...]
    name: str
    host: str
    port: int
    ready_timeout_s: float
    env: Mapping[str, str] | None = None
    health_path: str = "/health"

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@dataclass(frozen=True)
class HealthWait:
    """How :func:`poll_health` ended: ``outcome`` is ``"ready"`` (200 after ``waited_s``),
    ``"exited"`` (the child ended first, with ``exit_code``), ``"stopped"`` (the caller's
    ``stopped()`` said so) or ``"timeout"``; ``last`` is the last answer seen (``HTTP 503``, an
    httpx transport error's name, or ``no answer``)."""

    outcome: str
    waited_s: float
    last: str
    exit_code: int | None = None


def poll_health(
    url: str,
    *,
    timeout_s: float,
    interval_s: float = POLL_INTERVAL_S,
    exit_code: Callable[[], int | None] = lambda: None,
    stopped: Callable[[], bool] = lambda: False,
) -> HealthWait:
    """Poll ``GET url`` until it answers 200, the child exits, the caller stops, or ``timeout_s``.

    Servers bind their socket late (trtllm-serve after loading and warming up) or answer 503
    while loading, so connection errors and non-200 answers mean "not yet". Every server child
    spectool starts (``serve``, ``tune``'s drivers) waits through this one loop; callers turn the
    outcome into their own error, with their own log tail.
    """
    from spectool.measure.client import tls_context

    start = time.perf_counter()
    last = "no answer"
    with httpx.Client(timeout=httpx.Timeout(min(5.0, timeout_s)), verify=tls_context()) as client:
        while True:
            if stopped():
                return HealthWait("stopped", time.perf_counter() - start, last)
            code = exit_code()
            if code is not None:
                return HealthWait("exited", time.perf_counter() - start, last, code)
            try:
                response = client.get(url)
                if response.status_code == 200:
                    return HealthWait("ready", time.perf_counter() - start, last)
                last = f"HTTP {response.status_code}"
            except httpx.TransportError as exc:
                last = type(exc).__name__
            waited = time.perf_counter() - start
            if waited >= timeout_s:
                return HealthWait("timeout", waited, last)
            time.sleep(min(interval_s, max(0.0, timeout_s - waited)))


@dataclass(frozen=True)
class ChildResult:
    """How a supervised child ended: its exit code and the signal the user sent, if any."""

    returncode: int | None
    stop_signal: int | None
    ready_after_s: float


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the kernel's pick)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    """:class:`BadInputError` naming ``host:port`` when something already listens there."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise BadInputError(
                f"{host}:{port}",
                f"cannot listen there ({exc.strerror or exc}): another server holds the port; "
                "stop it or pass --port",
            ) from None


class _Tail:
    """The last lines of the child's output, filled by a reader thread."""

    def __init__(self, limit: int) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=limit)
        self.lock = threading.Lock()
        self.closed = threading.Event()  # set when the child's output reached end of file

    def add(self, line: str) -> None:
        with self.lock:
            self.lines.append(line)

    def text(self) -> str:
        with self.lock:
            return "\n".join(self.lines)


def _pump(stream: Any, tail: _Tail, on_output: OutputFn | None) -> None:
    for raw in iter(stream.readline, ""):
        line = raw.rstrip("\n")
        tail.add(line)
        if on_output is not None:
            on_output(line)
    stream.close()
    tail.closed.set()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member changed credentials; still there
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(proc: subprocess.Popen[str], pgid: int, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the child's process group, SIGKILL what is left after ``grace_s``, reap."""
    if proc.poll() is None or _group_alive(pgid):
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is None or _group_alive(pgid):
        _signal_group(pgid, signal.SIGKILL)
        proc.wait()
        end = time.monotonic() + 5.0
        while _group_alive(pgid) and time.monotonic() < end:
            time.sleep(0.05)


def spawn(
    argv: Sequence[str],
    *,
    name: str,
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    stdin: int | None = subprocess.DEVNULL,
    stdout: int | None = None,
) -> subprocess.Popen[Any]:
    """Start ``argv`` (no shell) in its own session and process group.

    Without ``log_path`` its output (stdout and stderr) is a text pipe for the caller to read;
    with one, stderr (and stdout unless given) is appended to that file. ``ChildProcessError_``
    when it cannot start.
    """
    log: IO[bytes] | None = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")  # the child gets its own descriptor
    piped = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "bufsize": 1,
             "errors": "replace"}  # fmt: skip
    to_log = {"stdout": log if stdout is None else stdout, "stderr": log}
    try:
        return subprocess.Popen(  # type: ignore[call-overload]
            list(argv),
            stdin=stdin,
            env=dict(env) if env is not None else None,
            start_new_session=True,  # own session and process group: see the module docstring
            **(piped if log is None else to_log),
        )
    except OSError as exc:
        raise ChildProcessError_(
            f"cannot start {name} ({argv[0]}): {exc.strerror or exc}"
        ) from None
    finally:
        if log is not None:
            log.close()  # the child holds its own descriptor


def stop(proc: subprocess.Popen[Any], grace_s: float = STOP_GRACE_S) -> None:
    """Stop the child's whole process group (it leads one: :func:`spawn`) and reap it."""
    stop_group(proc, proc.pid, grace_s)


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ("" when there is none)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(collections.deque(f, maxlen=lines)).rstrip()
    except OSError:
        return ""


def log_failure(name: str, what: str, log_path: Path) -> ChildProcessError_:
    """A :class:`ChildProcessError_` saying ``name what``, with the log file's tail."""
    tail = log_tail(log_path)
    log = f"\n--- last lines of {log_path} ---\n{tail}" if tail else f" (see {log_path})"
    return ChildProcessError_(f"{name} {what}{log}")


def wait_healthy(
    base_url: str,
    proc: subprocess.Popen[Any],
    *,
    name: str,
    log_path: Path,
    timeout_s: float,
    health_path: str = "/health",
) -> float:
    """Seconds until ``GET base_url + health_path`` answered 200, for a child logging to
    ``log_path``; :class:`ChildProcessError_` (with the log tail) when the child exits first or
    is not ready within ``timeout_s``."""
    url = base_url + health_path
    wait = poll_health(url, timeout_s=timeout_s, exit_code=proc.poll)
    if wait.outcome == "exited":
        raise log_failure(
            name, f"exited with code {wait.exit_code} before {url} answered", log_path
        )
    if wait.outcome != "ready":
        raise log_failure(
            name,
            f"not ready after {timeout_s:.0f} s ({url}: {wait.last}); raise --ready-timeout "
            "if the model is still loading",
            log_path,
        )
    return wait.waited_s


def _failure(name: str, what: str, tail: _Tail) -> ChildProcessError_:
    tail.closed.wait(TAIL_DRAIN_S)  # let the reader catch the child's last words
    text = tail.text()
    log = f"\n--- last lines of {name}'s log ---\n{text}" if text else f" ({name} printed nothing)"
    return ChildProcessError_(f"{name} {what}{log}")


class _SignalForwarder:
    """While active, SIGINT/SIGTERM to spectool go to the child's group (a second one: SIGKILL)."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is not None:
            _signal_group(self.pgid, signal.SIGKILL)
            return
        self.received = signum
        _signal_group(self.pgid, signum)

    def __enter__(self) -> _SignalForwarder:
        if threading.current_thread() is threading.main_thread():
            for sig in FORWARDED_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _wait_ready(
    spec: ChildSpec, proc: subprocess.Popen[str], forwarder: _SignalForwarder, tail: _Tail
) -> float | None:
    """Seconds until ``/health`` answered 200; None when the user stopped it meanwhile."""
    url = spec.base_url + spec.health_path
    wait = poll_health(
        url,
        timeout_s=spec.ready_timeout_s,
        exit_code=proc.poll,
        stopped=lambda: forwarder.received is not None,
    )
    if wait.outcome == "ready":
        return wait.waited_s
    if wait.outcome == "stopped":
        return None
    if wait.outcome == "exited":
        raise _failure(spec.name, f"exited with code {wait.exit_code} before {url} answered", tail)
    raise _failure(
        spec.name,
        f"not ready after {spec.ready_timeout_s:.0f} s ({url}: {wait.last}); raise "
        "--ready-timeout if the model is still loading",
        tail,
    )


def _wait_exit(
    proc: subprocess.Popen[str], pgid: int, forwarder: _SignalForwarder, grace_s: float
) -> int:
    """The child's exit code; after a forwarded stop signal it gets ``grace_s``, then SIGKILL."""
    while True:
        try:
            return proc.wait(timeout=POLL_INTERVAL_S)
        except subprocess.TimeoutExpired:
            if forwarder.received is None:
                continue
        try:
            return proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(pgid, signal.SIGKILL)
            return proc.wait()


def run_supervised(
    spec: ChildSpec,
    *,
    on_output: OutputFn | None = None,
    on_ready: Callable[[str, float], None] | None = None,
    tail_lines: int = TAIL_LINES,
    stop_grace_s: float = STOP_GRACE_S,
) -> ChildResult:
    """Start ``spec``'s child, stream its output to ``on_output``, call ``on_ready(url, s)`` once
    ``/health`` answers, and wait until it ends or the user stops it; blocks.

    Raises :class:`BadInputError` when the port is taken (nothing started) and
    :class:`ChildProcessError_` with the log tail when the child fails to start, does not get
    ready in time, or exits on its own. The child's process group is empty when this returns.
    """
    check_port_free(spec.host, spec.port)
    tail = _Tail(tail_lines)
    proc = spawn(spec.argv, name=spec.name, env=spec.env)
    pgid = proc.pid  # start_new_session: the child leads its own group
    reader = threading.Thread(
        target=_pump, args=(proc.stdout, tail, on_output), name="child-log", daemon=True
    )
    reader.start()
    try:
        with _SignalForwarder(pgid) as forwarder:
            ready_s = _wait_ready(spec, proc, forwarder, tail)
            if ready_s is not None and on_ready is not None:
                on_ready(spec.base_url, ready_s)
            code = _wait_exit(proc, pgid, forwarder, stop_grace_s)
            if forwarder.received is None:
                raise _failure(spec.name, f"exited with code {code} while serving", tail)
            return ChildResult(code, forwarder.received, ready_s or 0.0)
    finally:
        stop_group(proc, pgid, stop_grace_s)
        reader.join(timeout=5.0)


def run_to_completion(
    argv: Sequence[str],
    *,
    name: str,
    on_output: OutputFn | None = None,
    env: Mapping[str, str] | None = None,
    tail_lines: int = TAIL_LINES,
) -> None:
    """Run a build step to the end, streaming its output; :class:`ChildProcessError_` with the
    log tail when it fails. SIGINT/SIGTERM are forwarded; the group is emptied on the way out."""
    tail = _Tail(tail_lines)
    proc = spawn(argv, name=name, env=env)
    reader = threading.Thread(
        target=_pump, args=(proc.stdout, tail, on_output), name="step-log", daemon=True
    )
    reader.start()
    try:
        with _SignalForwarder(proc.pid) as forwarder:
            code = proc.wait()
        if forwarder.received is not None:
            raise KeyboardInterrupt
        if code != 0:
            raise _failure(name, f"failed with exit code {code}", tail)
    finally:
        stop_group(proc, proc.pid)
        reader.join(timeout=5.0)
