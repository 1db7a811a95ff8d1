"""The embedded engine's config files (``speculative.json`` / ``baseline.json``), torch-free.

``spectool build --engine torch`` writes them and must run without torch, so the rules of
:class:`spectool.engine.engine.EngineConfig` that a build file can break are checked here with
the standard library (``tests/deploy/test_engine_config.py`` holds both to the same verdicts).
``spectool serve DIR`` hands the file itself to the server child (``--engine-config FILE``),
which reads it with :func:`read_engine_config` and builds the EngineConfig from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spectool import methods
from spectool.errors import BadInputError, ConfigError

# The keys a build writes (EngineConfig fields; device and dtype are the serving machine's).
FILE_KEYS = frozenset(
    {"method", "max_draft_len", "draft_len_schedule", "max_concurrency", "max_batch_size",
     "max_seq_len"}
)  # fmt: skip


def _int(fields: Mapping[str, Any], key: str, where: str) -> int:
    value = fields[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(where, f"{key} must be an integer, got {value!r}")
    return value


def _is_int_key(key: object) -> bool:
    """An integer, or a JSON object key spelling one (``"4"``)."""
    if isinstance(key, bool):
        return False
    if isinstance(key, int):
        return True
    return isinstance(key, str) and key.strip().lstrip("-").isdigit()


def validate_engine_config(fields: Mapping[str, Any], where: str = "engine config") -> None:
    """:class:`ConfigError` for anything EngineConfig would refuse in these fields."""
    method = fields.get("method", methods.NONE)
    runnable = methods.engine_methods("torch", baseline=True)
    if method not in runnable:
        raise ConfigError(where, f"method must be one of {', '.join(runnable)}, got {method!r}")
    k = _int(fields, "max_draft_len", where) if "max_draft_len" in fields else 4
    if k < 0 or (method != methods.NONE and k < 1):
        raise ConfigError(where, f"max_draft_len must be >= 1, got {k}")
    schedule = fields.get("draft_len_schedule")
    cap = fields.get("max_concurrency")
    if cap is not None and schedule is not None:
        raise ConfigError(where, "max_concurrency and draft_len_schedule are mutually exclusive")
    if cap is not None and _int(fields, "max_concurrency", where) < 1:
        raise ConfigError(where, f"max_concurrency must be >= 1, got {cap}")
    if schedule is not None:
        if not isinstance(schedule, Mapping) or not schedule:
            raise ConfigError(where, "draft_len_schedule is empty")
        for batch, draft in schedule.items():
            if not _is_int_key(batch) or isinstance(draft, bool) or not isinstance(draft, int):
                raise ConfigError(
                    where,
                    f"draft_len_schedule must map batch sizes to integers, got {batch!r}: "
                    f"{draft!r}",
                )
            if int(batch) < 1:
                raise ConfigError(where, f"draft_len_schedule keys must be >= 1, got {batch}")
            if not 0 <= draft <= k:
                raise ConfigError(
                    where,
                    f"draft_len_schedule[{batch}] = {draft} is outside 0..max_draft_len ({k})",
                )
        smallest = min(schedule, key=int)
        if schedule[smallest] != k:
            raise ConfigError(
                where,
                f"draft_len_schedule[{smallest}] (the smallest key) must equal max_draft_len "
                f"{k}, got {schedule[smallest]}",
            )
    for key, low in (("max_batch_size", 1), ("max_seq_len", 2)):
        if key in fields and _int(fields, key, where) < low:
            raise ConfigError(where, f"{key} must be >= {low}, got {fields[key]}")


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
