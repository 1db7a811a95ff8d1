"""SIGTERM during tune's load generator (asyncio) stops it as Ctrl-C does: the running task is
cancelled and cleans up, then KeyboardInterrupt. Raised from the signal handler instead, the
interrupt lands wherever the main thread is (inside a task's step, inside the event loop), and
a SIGTERMed tune was seen waiting forever in the loop's shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spectool.cli.tune import _sigterm_as_interrupt, _StopRequest


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_sigterm_inside_asyncio_cancels_the_task_and_its_cleanup_runs(sigint: str) -> None:
    """Both ways a tune starts: in the foreground (SIGINT's default handler, which asyncio.run
    borrows) and in the background from a shell without job control (SIGINT ignored, as
    ``nohup spectool tune ... &`` in a script): there asyncio installs no handler of its own,
    and a KeyboardInterrupt raised from the SIGTERM handler used to land inside the task."""
    seen: list[str] = []

    async def load() -> None:
        try:
            end = time.monotonic() + 1.0
            while time.monotonic() < end:  # busy in a task's step when the signal comes
                pass
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        except KeyboardInterrupt:
            seen.append("interrupted inside the task")
            raise
        finally:
            await asyncio.sleep(0.01)  # async cleanup (the poller's last read) still runs
            seen.append("cleaned up")

    stop = _StopRequest()
    handler = signal.default_int_handler if sigint == "default" else signal.SIG_IGN
    previous = signal.signal(signal.SIGINT, handler)  # whatever state pytest was started in
    try:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt), _sigterm_as_interrupt(stop):
            asyncio.run(load())
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stop.requested
    assert seen == ["cancelled", "cleaned up"]
    assert time.monotonic() - started < 5


def test_an_interrupt_handled_inside_a_string_eval_keeps_the_exit_code(tmp_path: Path) -> None:
    """The stop lands wherever the main thread is; inside a lazy import's string ``exec``
    (dataclasses, numpy.f2py under scipy.stats) CPython marks the process as ended by Ctrl-C,
    and under ``python -m`` it then died by SIGINT instead of exiting 130 (a SIGTERMed
    ``test_tune_cli`` run in CI). ``main`` keeps the code it returns."""
    (tmp_path / "interrupted_cli.py").write_text(
        "import sys\n"
        "from spectool.cli.app import app, main\n"
        "@app.command('stop-in-eval')\n"
        "def stop_in_eval() -> None:\n"
        "    exec('raise KeyboardInterrupt', {})  # as a stop landing in a lazy import\n"
        "sys.exit(main(['stop-in-eval']))\n",
        encoding="utf-8",
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run(  # noqa: S603 (this interpreter, a fixed module)
        [sys.executable, "-m", "interrupted_cli"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 130, (done.returncode, done.stderr)
