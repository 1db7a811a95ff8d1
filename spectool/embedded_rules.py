"""The embedded engine's configuration rules, torch-free: one function, used by
:class:`spectool.engine.engine.EngineConfig` on construction and by ``spectool build`` /
``serve`` on the engine's config files (:mod:`spectool.deploy.engine_config`), which must run
without torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spectool import methods
from spectool.errors import ConfigError


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


def validate_engine_config(
    fields: Mapping[str, Any],
    where: str = "engine config",
    *,
    runnable: Sequence[str] | None = None,
) -> None:
    """:class:`ConfigError` for anything the embedded engine refuses in these fields (those of
    a build file: method, draft lengths, schedule, gate, batch and sequence limits).

    ``runnable``: the methods to accept; default the table's torch methods
    (:func:`spectool.methods.engine_methods`); the engine passes its live proposer registry.
    """
    method = fields.get("method", methods.NONE)
    if runnable is None:
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
