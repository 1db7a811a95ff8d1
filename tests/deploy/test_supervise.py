"""The one child supervisor: a child logging to a file (tune's servers) starts in its own group,
fails with its log's tail, and is stopped as a whole group."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from deploy_helpers import group_members

from spectool.deploy import supervise
from spectool.errors import ChildProcessError_


def test_log_file_child_fails_with_the_tail_of_its_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "server.log"
    code = "import sys; print('loading weights'); sys.stderr.write('boom: no GPU\\n'); sys.exit(7)"
    proc = supervise.spawn([sys.executable, "-c", code], name="fake server", log_path=log)
    with pytest.raises(ChildProcessError_) as exc:
        supervise.wait_healthy(
            "http://127.0.0.1:9", proc, name="fake server", log_path=log, timeout_s=30
        )
    message = str(exc.value)
    assert "fake server exited with code 7" in message and "boom: no GPU" in message
    assert "loading weights" in log.read_text()  # stdout went to the log too


def test_stop_empties_the_childs_group(tmp_path: Path) -> None:
    # the child starts a grandchild in its group; stop() must take both
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    )
    proc = supervise.spawn([sys.executable, "-c", code], name="sleeper", log_path=tmp_path / "l")
    deadline = time.monotonic() + 10
    while len(group_members(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(group_members(proc.pid)) == 2
    supervise.stop(proc, grace_s=5)
    assert group_members(proc.pid) == [] and proc.returncode is not None


def test_cannot_start_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ChildProcessError_, match="cannot start ghost"):
        supervise.spawn([str(tmp_path / "nope")], name="ghost", log_path=tmp_path / "l")
