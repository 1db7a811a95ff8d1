"""Atomic writes that never overwrite a user's file by accident."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from spectool.errors import OutputExistsError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes, *, force: bool = True) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    A reader sees the old file or the new one, never half of one. With ``force=False`` an
    existing file with different content is refused (:class:`OutputExistsError`); identical
    content is left as it is.
    """
    path = Path(path)
    if not force and path.exists():
        if path.is_file() and path.read_bytes() == data:
            return path
        raise OutputExistsError(path, "exists with different content; pass --force to overwrite")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file normal permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str, *, force: bool = True) -> Path:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"), force=force)


def append_line(path: str | Path, line: str) -> None:
    """Append one line and fsync it: a crash loses at most the line being written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line.rstrip("\n") + "\n")
        f.flush()
        os.fsync(f.fileno())
