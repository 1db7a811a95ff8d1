"""Server children of ``tune``: start in their own process group, log to a file, wait for health,
and stop the whole group, whatever way ``tune`` ends.

Unlike ``spectool serve`` (:mod:`spectool.deploy.supervise`, which runs one server until the
user stops it), ``tune`` starts and stops one server per configuration and measures it in
between, so it needs the start and the stop apart. Stopping reuses serve's
:func:`~spectool.deploy.supervise.stop_group` (SIGTERM to the group, SIGKILL after a grace
period, until the group is empty). The child's output is appended to a log file in the tune
folder, never to a pipe nobody reads; a failure raises
:class:`~spectool.errors.ChildProcessError_` (exit 3) with the log's last lines.
"""

from __future__ import annotations

import subprocess
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from spectool.deploy.supervise import poll_health, stop_group
from spectool.errors import ChildProcessError_

TAIL_LINES = 40
POLL_INTERVAL_S = 0.25
STOP_GRACE_S = 15.0


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ("" when there is none)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(deque(f, maxlen=lines)).rstrip()
    except OSError:
        return ""


def failure(name: str, what: str, log_path: Path) -> ChildProcessError_:
    """A :class:`ChildProcessError_` saying ``name what``, with the log's tail."""
    tail = log_tail(log_path)
    log = f"\n--- last lines of {log_path} ---\n{tail}" if tail else f" (see {log_path})"
    return ChildProcessError_(f"{name} {what}{log}")


def spawn(
    argv: Sequence[str],
    *,
    name: str,
    log_path: Path,
    stdin: int | None = subprocess.DEVNULL,
    stdout: int | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[Any]:
    """Start ``argv`` (no shell) in a new session; stderr, and stdout unless given, to the log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log: IO[bytes] = open(log_path, "ab")  # the child gets its own descriptor
    try:
        return subprocess.Popen(
            list(argv),
            stdin=stdin,
            stdout=log if stdout is None else stdout,
            stderr=log,
            env=dict(env) if env is not None else None,
            start_new_session=True,  # own process group: stopped as a whole, Ctrl-C reaches tune
        )
    except OSError as exc:
        raise ChildProcessError_(
            f"cannot start {name} ({argv[0]}): {exc.strerror or exc}"
        ) from None
    finally:
        log.close()  # the child holds its own descriptor


def stop(proc: subprocess.Popen[Any], grace_s: float = STOP_GRACE_S) -> None:
    """Stop the child's whole process group (it leads one: :func:`spawn`) and reap it."""
    stop_group(proc, proc.pid, grace_s)


def wait_healthy(
    base_url: str,
    proc: subprocess.Popen[Any],
    *,
    name: str,
    log_path: Path,
    timeout_s: float,
    health_path: str = "/health",
) -> float:
    """Seconds until ``GET base_url + health_path`` answered 200.

    :class:`ChildProcessError_` (with the log tail) when the child exits first or is not ready
    within ``timeout_s``.
    """
    url = base_url + health_path
    wait = poll_health(url, timeout_s=timeout_s, interval_s=POLL_INTERVAL_S, exit_code=proc.poll)
    if wait.outcome == "exited":
        raise failure(name, f"exited with code {wait.exit_code} before {url} answered", log_path)
    if wait.outcome != "ready":
        raise failure(
            name,
            f"not ready after {timeout_s:.0f} s ({url}: {wait.last}); raise --ready-timeout "
            "if the model is still loading",
            log_path,
        )
    return wait.waited_s
