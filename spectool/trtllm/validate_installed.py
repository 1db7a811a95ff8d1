"""Validate LLM-API options with an installed TensorRT-LLM of the requested generation (the
"installed" path of :mod:`spectool.trtllm.validate`); runs only where TensorRT-LLM is installed.
"""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Mapping
from typing import Any

from spectool.errors import ConfigError
from spectool.trtllm.versions import detect_installed_version, release_for_version


def validate_with_installed(options: Mapping[str, Any], release: str, backend: str) -> bool:
    """True when an installed TensorRT-LLM of ``release``'s generation validated ``options``
    (:class:`ConfigError` when it refused them); False when none is usable here."""
    version = detect_installed_version()
    if version is None or _generation_of(version) != release:
        return False
    return _validate_installed(options, backend, version)


def _generation_of(version: str) -> str | None:
    try:
        return release_for_version(version)
    except ConfigError:
        return None


def _validate_installed(options: Mapping[str, Any], backend: str, version: str) -> bool:
    """Validate with the installed package; False when it cannot be used (then: built-in)."""
    try:
        llm_args = importlib.import_module("tensorrt_llm.llmapi.llm_args")
    except Exception:  # any import failure (CUDA libraries, MPI) means: not usable here
        return _validate_json_schema(options, version)
    from pydantic import AliasChoices, TypeAdapter, ValidationError

    cls = getattr(llm_args, "TorchLlmArgs" if backend == "pytorch" else "TrtLlmArgs", None)
    if cls is None:
        raise ConfigError(f"backend {backend!r}", f"not in the installed TensorRT-LLM {version}")
    fields = cls.model_fields
    keys: dict[str, str] = {}
    for name, f in fields.items():
        keys.setdefault(name, name)
        alias = f.validation_alias
        choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
        for choice in choices:
            if isinstance(choice, str):
                keys[choice] = name
        if f.alias:
            keys[f.alias] = name
    from_dict = getattr(getattr(llm_args, "DecodingBaseConfig", None), "from_dict", None)
    for key, value in options.items():
        name = keys.get(key)
        if name is None:
            raise ConfigError(str(key), f"unknown option for the installed TensorRT-LLM {version}")
        value = copy.deepcopy(value)
        try:
            if name == "speculative_config" and isinstance(value, dict) and from_dict:
                from_dict(value)
            else:
                TypeAdapter(fields[name].annotation).validate_python(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first.get("loc", ()))
            raise ConfigError(
                f"{key}.{loc}" if loc else key, f"{first['msg']} (TensorRT-LLM {version})"
            ) from exc
        except (ValueError, TypeError, AssertionError) as exc:
            raise ConfigError(key, f"{exc} (TensorRT-LLM {version})") from exc
    return True


def _validate_json_schema(options: Mapping[str, Any], version: str) -> bool:
    """Validate with ``tensorrt_llm/schemas/trtllm-serve-config.schema.json`` if usable."""
    import importlib.metadata

    try:
        import jsonschema  # optional; not a spectool dependency
    except ImportError:
        return False
    try:
        dist = importlib.metadata.distribution("tensorrt_llm")
    except importlib.metadata.PackageNotFoundError:
        return False
    path = dist.locate_file("tensorrt_llm/schemas/trtllm-serve-config.schema.json")
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    errors = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(dict(options)), key=lambda e: e.path
    )
    if errors:
        first = errors[0]
        where = ".".join(str(p) for p in first.absolute_path) or "options"
        raise ConfigError(where, f"{first.message} (TensorRT-LLM {version} JSON schema)")
    return True
