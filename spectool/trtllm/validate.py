"""Validate LLM-API options (the ``trtllm-serve --config`` YAML) for one TensorRT-LLM release.

Why: TensorRT-LLM's config classes reject unknown keys (``StrictBaseModel``), and their field
sets change release to release (``speculative_model_dir`` → ``speculative_model``, ``Eagle`` →
``Eagle3``, ``acceptance_window`` → ``acceptance_rate_window_size``...). A YAML that fails there
fails minutes into a server start; spectool refuses it before launching anything.

Two paths:

* **installed** (:mod:`spectool.trtllm.validate_installed`) — when ``tensorrt_llm`` is installed and its version maps to the requested
  release (:func:`spectool.trtllm.releases.release_for_version`), each top-level option is
  validated by the installed pydantic field type (``TypeAdapter(field.annotation)``;
  ``DecodingBaseConfig.from_dict`` for ``speculative_config`` in the generations that dispatch
  with it). No model is needed: ``TorchLlmArgs`` itself is never built, so its model-loading
  validators do not run. If the package cannot be imported (e.g. no CUDA libraries), its shipped
  JSON schema is used when ``jsonschema`` is importable, else the built-in path.
* **built-in** — the option tables of :mod:`spectool.trtllm.releases`: an unknown key anywhere is an
  error; ``int``/``float``/``bool``/``str``/``dict``/``list``/``Literal``/``Optional``/``Union``,
  pydantic's constrained ints and floats, nested config classes and string enums are checked;
  then the release rules spectool knows (``decoding_type`` spelling and backend, draft-length
  schedule rules, required drafter). Types defined outside ``llm_args.py`` (``QuantConfig``,
  ``LoraConfig``, ``BuildConfig``...) are not in the tables and pass unchecked.

Every failure is a :class:`spectool.errors.ConfigError` whose ``where`` is the key path
(``speculative_config.max_draft_len``).
"""

from __future__ import annotations

import ast
import difflib
import functools
from collections.abc import Mapping
from typing import Any, NoReturn

from spectool.errors import ConfigError
from spectool.trtllm.releases import (
    ClassSpec,
    ReleaseInfo,
    ReleaseSchema,
    check_backend,
    release_info,
)

_LISTS = {"List", "list", "Sequence", "Set", "set", "FrozenSet", "frozenset", "Tuple", "tuple"}
_DICTS = {"Dict", "dict", "Mapping", "MutableMapping"}
_INTS = {
    "int": None,
    "StrictInt": None,
    "NonNegativeInt": 0,
    "_StrictNonNegativeInt": 0,
    "PositiveInt": 1,
    "_StrictPositiveInt": 1,
}
_FLOATS = {"float": None, "NonNegativeFloat": 0.0, "PositiveFloat": 0.0}
_ANY = {"Any", "object"}
# Classes whose speculative model (drafter) must be given, per backend [SRC llm_args.py: Eagle
# validate "Draft model must be provided for EAGLE"; DraftTarget; 1.2 TrtLlmArgs asserts
# speculative_model for Eagle].
_NEEDS_DRAFTER = {"EagleDecodingConfig", "Eagle3DecodingConfig", "DraftTargetDecodingConfig"}
_POSITIVE_DEPTH = _NEEDS_DRAFTER | {"MedusaDecodingConfig"}
# Releases where the documented spelling (``DraftTarget``) fails: 1.2's ``speculative_config`` is
# a pydantic union discriminated on ``decoding_type`` with the literal ``Draft_Target`` and no
# alias mapping (DraftTargetDecodingConfig.decoding_type: Literal["Draft_Target"], option table
# v1.2.json); a discriminated union matches its tags exactly. main records a
# ``_decoding_type_alias`` for the documented spelling, so main keeps accepting it.
_LITERAL_ONLY = frozenset({"1.2"})


def validate_options(
    options: Mapping[str, Any], release: str, backend: str, *, use_installed: bool = True
) -> None:
    """Raise :class:`ConfigError` naming the key path if ``options`` is invalid for the release.

    ``options`` is the parsed YAML mapping (what ``yaml.safe_load`` returns for a ``--config``
    file); ``backend`` is ``pytorch`` or ``tensorrt``. With ``use_installed`` (default) an
    installed TensorRT-LLM of the same generation validates instead of the built-in tables.
    """
    check_backend(backend)
    info = release_info(release)
    missing = info.backend_missing_reason(backend)
    if missing is not None:
        raise ConfigError(f"backend {backend!r}", missing)
    if not isinstance(options, Mapping):
        raise ConfigError("options", f"the YAML root must be a mapping, got {_kind(options)}")
    if use_installed:
        from spectool.trtllm.validate_installed import validate_with_installed

        if validate_with_installed(options, release, backend):
            return
    _Checker(info, backend).check_top(options)


# --------------------------------------------------------------------------------------------
# Built-in path
# --------------------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, (list, tuple)):
        return "list"
    return type(value).__name__


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


@functools.lru_cache(maxsize=2048)
def _parse(annotation: str) -> ast.expr:
    """The annotation string as an expression tree (parsed, never evaluated)."""
    try:
        return ast.parse(annotation, mode="eval").body
    except SyntaxError:
        return ast.Name(id="Any")  # an annotation the extractor could not render: unchecked


def _name_of(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _args(node: ast.Subscript) -> list[ast.expr]:
    sl = node.slice
    return list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]


def _is_none(node: ast.expr) -> bool:
    return (isinstance(node, ast.Constant) and node.value is None) or _name_of(node) in (
        "None",
        "NoneType",
    )


def _flatten_union(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _flatten_union(node.left) + _flatten_union(node.right)
    if isinstance(node, ast.Subscript) and _name_of(node.value) in ("Union", "Optional"):
        members = [m for a in _args(node) for m in _flatten_union(a)]
        if _name_of(node.value) == "Optional":
            members.append(ast.Constant(value=None))
        return members
    return [node]


class _Checker:
    """Walks a YAML mapping against one release's option tables; raises on the first problem."""

    def __init__(self, info: ReleaseInfo, backend: str) -> None:
        self.info = info
        self.schema: ReleaseSchema = info.schema
        self.backend = backend
        self.rel = f"TensorRT-LLM {info.release}"

    def fail(self, path: str, problem: str) -> NoReturn:
        raise ConfigError(path or "options", problem)

    # -- classes ------------------------------------------------------------------------------

    def check_top(self, options: Mapping[str, Any]) -> None:
        top = self.schema.top_class(self.backend)
        self.check_class(options, top, "", top_level=True)
        self.check_top_rules(options)

    def check_class(
        self, value: Any, cls: ClassSpec, path: str, *, top_level: bool = False
    ) -> None:
        if not isinstance(value, Mapping):
            self.fail(path, f"expected a mapping ({cls.name}), got {_kind(value)}")
        seen: dict[str, str] = {}
        for key, item in value.items():
            kpath = _join(path, key)
            if not isinstance(key, str):
                self.fail(kpath, f"keys of {cls.name} must be strings, got {_kind(key)}")
            fname = cls.keys.get(key)
            if fname is None:
                close = difflib.get_close_matches(key, list(cls.keys), n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                self.fail(kpath, f"unknown key for {cls.name} in {self.rel}{hint}")
            if fname in seen:
                self.fail(kpath, f"same field as {seen[fname]!r} ({cls.name}.{fname}); keep one")
            seen[fname] = key
            if top_level and fname == self.schema.speculative.field:
                self.check_speculative(item, kpath)
                continue
            self.check_type(_parse(cls.fields[fname].annotation), item, kpath)
        if not top_level:
            for f in cls.fields.values():
                if f.required and not any(k in value for k in f.keys):
                    self.fail(_join(path, f.name), f"required by {cls.name} in {self.rel}")

    # -- types --------------------------------------------------------------------------------

    def check_type(self, node: ast.expr, value: Any, path: str) -> None:
        members = _flatten_union(node)
        if len(members) > 1:
            self.check_union(node, members, value, path)
            return
        if _is_none(node):
            if value is not None:
                self.fail(path, f"expected null, got {_kind(value)}")
            return
        if isinstance(node, ast.Subscript):
            self.check_generic(node, value, path)
            return
        name = _name_of(node)
        if name is not None:
            self.check_name(name, value, path)
        # anything else (strings, calls) is not a type spectool can check

    def check_union(self, node: ast.expr, members: list[ast.expr], value: Any, path: str) -> None:
        concrete = [m for m in members if not _is_none(m)]
        if value is None:
            if len(concrete) == len(members):
                self.fail(path, f"must not be null (expected {ast.unparse(node)})")
            return
        if len(concrete) == 1:
            self.check_type(concrete[0], value, path)
            return
        nested: list[ConfigError] = []
        for member in concrete:
            try:
                self.check_type(member, value, path)
                return
            except ConfigError as exc:
                if exc.where and exc.where != path:
                    nested.append(exc)
        if len(nested) == 1:
            raise nested[0]
        self.fail(path, f"expected {ast.unparse(node)}, got {_kind(value)} {value!r}")

    def check_generic(self, node: ast.Subscript, value: Any, path: str) -> None:
        base = _name_of(node.value)
        args = _args(node)
        if base == "Literal":
            allowed = [a.value for a in args if isinstance(a, ast.Constant)]
            if not any(value == a and type(value) is type(a) for a in allowed):
                choices = ", ".join(repr(a) for a in allowed)
                self.fail(path, f"must be one of {choices}, got {value!r}")
            return
        if base == "Annotated":
            self.check_type(args[0], value, path)
            return
        if base in _LISTS:
            if not isinstance(value, (list, tuple)):
                self.fail(path, f"expected a list ({ast.unparse(node)}), got {_kind(value)}")
            fixed = base in ("Tuple", "tuple") and not (
                len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value is Ellipsis
            )
            if fixed and len(args) != len(value):
                self.fail(path, f"expected {len(args)} items ({ast.unparse(node)})")
            for i, item in enumerate(value):
                self.check_type(args[i] if fixed else args[0], item, f"{path}[{i}]")
            return
        if base in _DICTS:
            if not isinstance(value, Mapping):
                self.fail(path, f"expected a mapping ({ast.unparse(node)}), got {_kind(value)}")
            if len(args) == 2:
                for k, v in value.items():
                    self.check_type(args[0], k, f"{path}[{k!r}]")
                    self.check_type(args[1], v, _join(path, k))
            return
        # other generics (Callable[...], Type[...]) are not YAML-settable: unchecked

    def check_name(self, name: str, value: Any, path: str) -> None:
        if name in _ANY:
            return
        if name in _INTS:
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(path, f"expected an integer ({name}), got {_kind(value)} {value!r}")
            low = _INTS[name]
            if low is not None and value < low:
                self.fail(path, f"must be >= {low} ({name}), got {value}")
            return
        if name in _FLOATS:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                self.fail(path, f"expected a number ({name}), got {_kind(value)} {value!r}")
            low = _FLOATS[name]
            if low is not None and (value < low or (name == "PositiveFloat" and value == 0)):
                self.fail(
                    path, f"must be {'>' if name == 'PositiveFloat' else '>='} 0, got {value}"
                )
            return
        if name == "bool":
            if not isinstance(value, bool):
                self.fail(path, f"expected true or false, got {_kind(value)} {value!r}")
            return
        if name in ("str", "Path", "PathLike"):
            if not isinstance(value, str):
                self.fail(path, f"expected a string, got {_kind(value)} {value!r}")
            return
        if name in _LISTS:
            if not isinstance(value, (list, tuple)):
                self.fail(path, f"expected a list, got {_kind(value)}")
            return
        if name in _DICTS:
            if not isinstance(value, Mapping):
                self.fail(path, f"expected a mapping, got {_kind(value)}")
            return
        union = self.schema.unions.get(name)
        if union is not None:
            if not isinstance(value, Mapping):
                self.fail(path, f"expected a mapping ({name}), got {_kind(value)}")
            tag = value.get(union.discriminator, union.default)
            member = union.members.get(tag) if isinstance(tag, str) else None
            if member is None:
                self.fail(
                    _join(path, union.discriminator),
                    f"must be one of {', '.join(map(repr, union.members))}, got {tag!r}",
                )
            self.check_class(value, self.schema.classes[member], path)
            return
        cls = self.schema.cls(name)
        if cls is not None:
            self.check_class(value, cls, path)
            return
        if name in self.schema.enums:
            allowed = self.schema.enums[name]
            if not any(value == a and type(value) is type(a) for a in allowed):
                self.fail(path, f"must be one of {', '.join(map(repr, allowed))} ({name})")
            return
        # a type defined outside llm_args.py (QuantConfig, LoraConfig, ...): not in the tables

    # -- speculative_config -------------------------------------------------------------------

    def check_speculative(self, value: Any, path: str) -> None:
        if value is None:
            return
        spec = self.schema.speculative
        if not isinstance(value, Mapping):
            self.fail(path, f"expected a mapping, got {_kind(value)}")
        dpath = _join(path, "decoding_type")
        if "decoding_type" not in value:
            self.fail(dpath, f"required; one of {', '.join(spec.accepted())} in {self.rel}")
        spelling = value["decoding_type"]
        if spelling in spec.doc_aliases and self.info.release in _LITERAL_ONLY:
            self.fail(
                dpath,
                f"{self.rel} rejects {spelling!r}: speculative_config is a union discriminated "
                f"on decoding_type, whose literal is {spec.doc_aliases[spelling]!r}",
            )
        cls_name = spec.class_for(spelling) if isinstance(spelling, str) else None
        if cls_name is None:
            self.fail(
                dpath,
                f"unknown decoding_type {spelling!r} for {self.rel}; "
                f"accepted: {', '.join(spec.accepted())}",
            )
        backends = self.info.class_backends.get(cls_name, frozenset(self.info.backends))
        if self.backend not in backends:
            self.fail(
                dpath,
                f"{spelling} does not run on the {self.backend} backend of {self.rel} "
                f"(runs on: {', '.join(sorted(backends)) or 'none'})",
            )
        cls = self.schema.classes[cls_name]
        rest = {k: v for k, v in value.items() if k != "decoding_type"}
        self.check_class(rest, cls, path)
        self.check_speculative_rules(rest, cls, path)

    def check_speculative_rules(self, spec: Mapping[str, Any], cls: ClassSpec, path: str) -> None:
        depth = spec.get("max_draft_len")
        if cls.name in _POSITIVE_DEPTH and not depth:
            self.fail(_join(path, "max_draft_len"), f"must be > 0 for {cls.name} in {self.rel}")
        if self.info.release == "0.21" and self.backend == "pytorch":
            drafter_keys = ["pytorch_weights_path"]  # 0.21 PyTorch reads only this key [SRC]
        else:
            drafter_keys = [
                k for k in ("speculative_model", "speculative_model_dir") if k in cls.keys
            ]
        needs_drafter = cls.name in _NEEDS_DRAFTER and (
            self.backend == "pytorch" or self.info.release == "1.2"
        )
        if needs_drafter and not any(spec.get(k) for k in drafter_keys):
            self.fail(
                _join(path, drafter_keys[0]),
                f"the draft model is required by {cls.name} in {self.rel}",
            )
        if cls.name == "NGramDecodingConfig" and self.info.release == "0.21":
            for key, default in (("prompt_lookup_num_tokens", 2), ("max_matching_ngram_size", 4)):
                if spec.get(key, default) <= 0:
                    self.fail(_join(path, key), f"must be > 0 for NGram in {self.rel}")
        if self.info.release == "main" and spec.get("acceptance_rate_threshold") is not None:
            if not 0.0 <= spec["acceptance_rate_threshold"] <= 1.0:
                self.fail(_join(path, "acceptance_rate_threshold"), "must be within [0, 1]")
        self.check_schedule(spec, path)

    def check_schedule(self, spec: Mapping[str, Any], path: str) -> None:
        schedule = spec.get("draft_len_schedule")
        if schedule is None:
            return
        spath = _join(path, "draft_len_schedule")
        if not schedule:
            self.fail(spath, "must not be empty")
        for batch, length in schedule.items():
            if batch < 1:
                self.fail(_join(spath, batch), f"batch size threshold must be >= 1, got {batch}")
            if length < 0:
                self.fail(_join(spath, batch), f"draft length must be >= 0, got {length}")
        depth = spec.get("max_draft_len")
        rule = self.info.schedule_rule
        if rule == "contains_one":
            if 1 not in schedule:
                self.fail(spath, f"must include batch size 1 ({{1: max_draft_len}}) in {self.rel}")
            anchor = 1
        else:
            anchor = min(schedule)
            if spec.get("max_concurrency") is not None:
                self.fail(
                    spath, f"max_concurrency and draft_len_schedule are exclusive in {self.rel}"
                )
        if depth is not None:
            if schedule[anchor] != depth:
                self.fail(
                    _join(spath, anchor),
                    f"must equal max_draft_len ({depth}) in {self.rel}, got {schedule[anchor]}",
                )
            for batch, length in schedule.items():
                if length > depth:
                    self.fail(_join(spath, batch), f"{length} exceeds max_draft_len ({depth})")

    # -- top-level rules ----------------------------------------------------------------------

    def check_top_rules(self, options: Mapping[str, Any]) -> None:
        graph = options.get("cuda_graph_config")
        if isinstance(graph, Mapping) and graph.get("batch_sizes") and graph.get("max_batch_size"):
            if graph["max_batch_size"] != max(graph["batch_sizes"]):
                self.fail(
                    "cuda_graph_config.max_batch_size",
                    f"must equal max(batch_sizes) = {max(graph['batch_sizes'])} when both are set",
                )
        if options.get("cuda_graph_batch_sizes") and options.get("cuda_graph_max_batch_size"):
            self.fail(
                "cuda_graph_max_batch_size",
                f"do not set both cuda_graph_batch_sizes and cuda_graph_max_batch_size in {self.rel}",
            )
