"""TensorRT-LLM's option tables per release: every LLM-API config class, its fields, types,
defaults and accepted keys.

Generated from the research extraction of ``tensorrt_llm/llmapi/llm_args.py`` by
``scripts/extract_trtllm_schema.py`` and shipped as ``spectool/trtllm/schema/<release>.json``.
0.21 has no extraction of its own: it is 1.0 plus the deltas read in a pre-1.0 llm_args.py (see
the script), so it is approximate outside ``speculative_config``. spectool's policy on top of
them (spellings, drafter keys, serve flags) is :mod:`spectool.trtllm.releases`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Any, Literal

from spectool.errors import ConfigError
from spectool.suggest import suggestion

RELEASES: tuple[str, ...] = ("0.21", "1.0", "1.1", "1.2", "main")


def check_release(release: str) -> None:
    if release not in RELEASES:
        raise ConfigError(
            f"release {release!r}",
            f"unknown TensorRT-LLM release{suggestion(release, RELEASES)}; known: "
            f"{', '.join(RELEASES)}",
        )


@dataclass(frozen=True)
class FieldSpec:
    """One pydantic field of a TensorRT-LLM config class: annotation as written in the source."""

    name: str
    annotation: str
    default: str
    keys: tuple[str, ...]
    required: bool


@dataclass(frozen=True)
class ClassSpec:
    """One TensorRT-LLM config class; ``keys`` maps every accepted YAML key to its field name."""

    name: str
    extra: str
    fields: Mapping[str, FieldSpec]
    keys: Mapping[str, str]


@dataclass(frozen=True)
class UnionSpec:
    """A ``TypeAlias`` union discriminated on one key (``default`` when the key is absent)."""

    discriminator: str
    default: str
    members: Mapping[str, str]


@dataclass(frozen=True)
class SpeculativeDispatch:
    """How ``speculative_config`` picks its class: ``from_dict`` (≤1.1) or a discriminator."""

    field: str
    dispatch: Literal["from_dict", "discriminator"]
    decoding_types: Mapping[str, str]
    doc_aliases: Mapping[str, str]

    def class_for(self, spelling: str) -> str | None:
        """Config class for a ``decoding_type`` spelling (documented aliases included)."""
        canonical = self.doc_aliases.get(spelling, spelling)
        return self.decoding_types.get(canonical)

    def accepted(self) -> tuple[str, ...]:
        return tuple(self.decoding_types) + tuple(self.doc_aliases)


@dataclass(frozen=True)
class ReleaseSchema:
    """Every LLM-API option class of one release (see ``scripts/extract_trtllm_schema.py``)."""

    release: str
    label: str
    source: str
    top_level: Mapping[str, str | None]
    speculative: SpeculativeDispatch
    unions: Mapping[str, UnionSpec]
    aliases: Mapping[str, str]
    enums: Mapping[str, tuple[Any, ...]]
    classes: Mapping[str, ClassSpec]

    def cls(self, name: str) -> ClassSpec | None:
        """The class called ``name`` (following ``CudaGraphConfig = ...`` style aliases)."""
        return self.classes.get(self.aliases.get(name, name))

    def decoding_class(self, decoding_type: str) -> ClassSpec | None:
        """The config class (fields, types, defaults) behind a ``decoding_type`` spelling."""
        name = self.speculative.class_for(decoding_type)
        return self.classes.get(name) if name else None

    def top_class(self, backend: str) -> ClassSpec:
        name = self.top_level.get(backend)
        spec = self.cls(name) if name else None
        if spec is None:
            raise ConfigError(
                f"backend {backend!r}",
                f"does not exist in TensorRT-LLM {self.release} "
                f"(backends: {', '.join(b for b, c in self.top_level.items() if c)})",
            )
        return spec


def _class_spec(name: str, raw: Mapping[str, Any]) -> ClassSpec:
    fields: dict[str, FieldSpec] = {}
    keys: dict[str, str] = {}
    for fname, f in raw["fields"].items():
        accepted = tuple(f.get("keys", [fname]))
        fields[fname] = FieldSpec(
            fname, f["type"], f["default"], accepted, bool(f.get("required", False))
        )
        for key in accepted:
            keys[key] = fname
    return ClassSpec(name, raw["extra"], MappingProxyType(fields), MappingProxyType(keys))


@functools.cache
def load_schema(release: str) -> ReleaseSchema:
    """The shipped option table of ``release`` (one of :data:`RELEASES`)."""
    check_release(release)
    table = resources.files("spectool.trtllm").joinpath("schema").joinpath(f"{release}.json")
    text = table.read_text(encoding="utf-8")
    raw = json.loads(text)
    spec = raw["speculative"]
    return ReleaseSchema(
        release=raw["release"],
        label=raw["label"],
        source=raw["source"],
        top_level=MappingProxyType(dict(raw["top_level"])),
        speculative=SpeculativeDispatch(
            field=spec["field"],
            dispatch=spec["dispatch"],
            decoding_types=MappingProxyType(dict(spec["decoding_types"])),
            doc_aliases=MappingProxyType(dict(spec["doc_aliases"])),
        ),
        unions=MappingProxyType(
            {
                n: UnionSpec(u["discriminator"], u["default"], MappingProxyType(u["members"]))
                for n, u in raw["unions"].items()
            }
        ),
        aliases=MappingProxyType(dict(raw["aliases"])),
        enums=MappingProxyType({n: tuple(e["values"]) for n, e in raw["enums"].items()}),
        classes=MappingProxyType({n: _class_spec(n, c) for n, c in raw["classes"].items()}),
    )
