"""The embedded engine's config files (``speculative.json`` / ``baseline.json``), torch-free.

``spectool build --engine torch`` writes them and must run without torch: the rules a build file
can break are :func:`spectool.embedded_rules.validate_engine_config`, torch-free, the same function
:class:`spectool.engine.engine.EngineConfig` checks itself with.
``spectool serve DIR`` hands the file itself to the server child (``--engine-config FILE``),
which reads it with :func:`read_engine_config` and builds the EngineConfig from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spectool.embedded_rules import validate_engine_config
from spectool.errors import BadInputError, ConfigError

__all__ = ["FILE_KEYS", "engine_config_fields", "read_engine_config", "validate_engine_config"]

# The keys a build writes (EngineConfig fields; device and dtype are the serving machine's).
FILE_KEYS = frozenset(
    {"method", "max_draft_len", "draft_len_schedule", "max_concurrency", "max_batch_size",
     "max_seq_len"}
)  # fmt: skip


def engine_config_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """A build file's mapping as EngineConfig keyword arguments (schedule keys as integers)."""
    fields = dict(data)
    schedule = fields.get("draft_len_schedule")
    if schedule is not None:
        fields["draft_len_schedule"] = {int(b): int(k) for b, k in schedule.items()}
    return fields


def read_engine_config(path: Path) -> dict[str, Any]:
    """The EngineConfig fields in a build's ``speculative.json``/``baseline.json``, checked.

    :class:`BadInputError` naming the file when it is unreadable, not JSON, holds keys a build
    does not write, or breaks an engine rule.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadInputError(path, f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise BadInputError(path, f"malformed JSON: {exc}") from None
    if not isinstance(data, dict) or "method" not in data:
        raise BadInputError(path, "not an embedded-engine config written by spectool build")
    unknown = sorted(set(data) - FILE_KEYS)
    if unknown:
        raise BadInputError(path, f"unknown keys {', '.join(unknown)}")
    missing = sorted({"max_batch_size", "max_seq_len"} - set(data))
    if missing:
        raise BadInputError(path, f"missing {', '.join(missing)}")
    try:
        validate_engine_config(data, str(path))
    except ConfigError as exc:
        raise BadInputError(path, exc.problem) from None
    return engine_config_fields(data)
