"""Models shipped packed (``spectool:demo-target-mtp``) are assembled on first use: once per
cache, the same bytes every time, and an unusable cache is one line."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from spectool.builtin_models import builtin_path
from spectool.errors import CheckpointError


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_assembled_once_per_cache_with_the_same_bytes(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path / "a"))
    first = builtin_path("demo-target-mtp")
    assert first.is_relative_to(tmp_path / "a" / "models")
    mtime = (first / "model-00002-of-00002.safetensors").stat().st_mtime_ns
    assert builtin_path("demo-target-mtp") == first  # reused, not written again
    assert (first / "model-00002-of-00002.safetensors").stat().st_mtime_ns == mtime
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".")]  # no leftovers
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path / "b"))
    second = builtin_path("demo-target-mtp")
    assert second != first and _digest(second) == _digest(first)
    assert builtin_path("demo-target").name == "demo-target"  # shipped whole: the package's


def test_an_unusable_cache_is_a_one_line_error(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPECTOOL_CACHE", str(blocker))
    with pytest.raises(CheckpointError, match="set SPECTOOL_CACHE to a writable folder"):
        builtin_path("demo-target-mtp")
    with pytest.raises(CheckpointError, match="no such built-in model"):
        builtin_path("demo-target-mtq")
