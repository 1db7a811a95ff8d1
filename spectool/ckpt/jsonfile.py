"""Small, size-capped JSON files (config.json, index, tokenizer_config) read defensively."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spectool.constants import MAX_JSON_BYTES
from spectool.errors import CheckpointError


def read_json_object(path: Path, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """Parse ``path`` as a JSON object; any problem is a one-line :class:`CheckpointError`."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise CheckpointError(path, f"{size} bytes, over the {max_bytes} byte limit for JSON")
        raw = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(path, f"malformed JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(path, f"expected a JSON object, found {type(data).__name__}")
    return data
