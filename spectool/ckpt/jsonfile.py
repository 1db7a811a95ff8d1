"""Small, size-capped JSON files (config.json, index, tokenizer_config) read defensively.

Two caps apply before parsing: the file size (``max_bytes``), and for files up to
``DEPTH_SCAN_BYTES`` the nesting depth (``MAX_JSON_DEPTH``), found by a scan that costs a few
C-level passes over the bytes. Larger files (tokenizer.json, 10-30 MB) are not pre-scanned
(the scan would cost half a parse); the parser's own recursion guard stops them, and either way
the result is the same one-line :class:`CheckpointError`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from spectool.constants import MAX_JSON_BYTES, MAX_JSON_DEPTH
from spectool.errors import CheckpointError

DEPTH_SCAN_BYTES = 4 * 1024 * 1024
_STRING = re.compile(rb'"[^"]*"')  # after escaped quotes and backslashes are dropped
_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")


def nesting_exceeds(raw: bytes, limit: int) -> bool:
    """Whether the arrays and objects of the JSON text ``raw`` nest deeper than ``limit``.

    Brackets inside strings do not count; unbalanced text answers False (the parser reports it).
    """
    outside = _STRING.sub(b"", raw.replace(b"\\\\", b"").replace(b'\\"', b""))
    brackets = outside.translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return False
        inner_removed = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if len(inner_removed) == len(brackets):
            return False
        brackets = inner_removed
    return bool(brackets)


def read_json_object(path: Path, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """Parse ``path`` as a JSON object; any problem is a one-line :class:`CheckpointError`."""
    return parse_json_object(read_capped(path, max_bytes), path)


def read_capped(path: Path, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """``path``'s bytes, refused (one-line :class:`CheckpointError`) over ``max_bytes``."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise CheckpointError(path, f"{size} bytes, over the {max_bytes} byte limit for JSON")
        return path.read_bytes()
    except OSError as exc:
        raise CheckpointError(path, f"cannot read: {exc.strerror or exc}") from None


def parse_json_object(raw: bytes, path: Path) -> dict[str, Any]:
    """:func:`read_json_object` on bytes already read from ``path`` (named in errors)."""
    too_deep = CheckpointError(path, f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    if len(raw) <= DEPTH_SCAN_BYTES and nesting_exceeds(raw, MAX_JSON_DEPTH):
        raise too_deep
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(path, f"malformed JSON ({exc})") from None
    except RecursionError:
        raise too_deep from None
    if not isinstance(data, dict):
        raise CheckpointError(path, f"expected a JSON object, found {type(data).__name__}")
    return data
