"""Fixtures for tests that run spectool against the trtllm-serve double."""

from __future__ import annotations

import socket
import stat
import sys
from pathlib import Path

import pytest

DOUBLE = Path(__file__).with_name("trtllm_serve_double.py")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def trtllm_serve(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An executable ``trtllm-serve`` (the double) in a folder of its own."""
    folder = tmp_path_factory.mktemp("bin")
    exe = folder / "trtllm-serve"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DOUBLE}" "$@"\n', encoding="utf-8")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe
