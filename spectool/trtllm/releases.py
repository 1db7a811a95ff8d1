"""What spectool knows about each TensorRT-LLM release, in one place.

Releases (generations) spectool supports: ``0.21``, ``1.0``, ``1.1``, ``1.2`` (1.2.x) and ``main``
(the newest main seen in source, commit 0004396, after 1.3.0rc29: the TensorRT backend is gone).

Two kinds of knowledge live here:

* **Option tables** (:func:`load_schema`): every LLM-API config class of a release, its fields,
  types, defaults and accepted keys. They are generated from the research extraction of
  ``tensorrt_llm/llmapi/llm_args.py`` by ``scripts/extract_trtllm_schema.py`` and shipped as
  ``spectool/trtllm/schema/<release>.json``. 0.21 has no extraction of its own: it is 1.0 plus
  the deltas read in a pre-1.0 llm_args.py (see the script), so it is approximate outside
  ``speculative_config``.
* **Policy** (:func:`release_info`): which ``decoding_type`` spelling and which drafter key spectool
  writes per method, which backends and methods exist, ``trtllm-serve`` flags, architectures
  documented for Eagle3 and MTP, SM requirements. Sources are cited inline with the tags of
  ``../shared/research/trtllm.md``: [SRC] source read, [DOC] docs/release notes, [ISSUE] GitHub
  thread, [INFER] inference, not verified.

Spellings spectool emits (and why):

==========  ==============  =================  =====================================================
release     eagle3          draft_model        drafter key (eagle3/eagle/draft_model on pytorch)
==========  ==============  =================  =====================================================
0.21        ``Eagle``       ``DraftTarget``    ``pytorch_weights_path``
1.0, 1.1    ``Eagle``       ``DraftTarget``    ``speculative_model_dir``
1.2         ``Eagle3``      ``Draft_Target``   ``speculative_model_dir`` (alias of speculative_model)
main        ``Eagle3``      ``Draft_Target``   ``speculative_model``
==========  ==============  =================  =====================================================

* ≤1.1 parse ``speculative_config`` with ``DecodingBaseConfig.from_dict``, whose map has the keys
  MTP, Medusa, Eagle, Lookahead, NGram, DraftTarget (+UserProvided, AUTO in 1.0; +SaveState in
  1.1) [SRC llm_args.py 1.0, index id 1520735490]: ``Eagle3`` and ``Draft_Target`` do not exist
  there, and ``Eagle`` on the PyTorch backend *is* EAGLE-3 (``spec_dec_mode`` → EAGLE3[_ONE_MODEL]).
* From 1.2 ``speculative_config`` is a pydantic union discriminated on ``decoding_type`` whose
  literals are ``Eagle3`` and ``Draft_Target`` [SRC v1.2.json, main-0004396.json]. The docs write
  ``DraftTarget``; the code mapping it to ``Draft_Target`` was not found (only a private
  ``_decoding_type_alias`` "recorded for warnings"), while a discriminated union matches its
  literal tags exactly. spectool therefore writes the literal, which every parser of that
  generation accepts, and accepts ``DraftTarget`` when validating a user's file.
* 1.2 accepts both ``speculative_model`` and ``speculative_model_dir`` (AliasChoices); spectool
  writes ``speculative_model_dir`` there because 1.2 release candidates used it (issue #10396 on
  1.2.0rc6) and 1.2.x still accepts it; main writes the canonical ``speculative_model``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Any, Literal

from spectool import methods
from spectool.errors import ConfigError

RELEASES: tuple[str, ...] = ("0.21", "1.0", "1.1", "1.2", "main")
# The universe of method names is spectool.methods'; which release runs which is decided here.
METHODS: tuple[str, ...] = methods.METHODS
BACKENDS: tuple[str, ...] = ("pytorch", "tensorrt")
DRAFTER_KINDS: tuple[str, ...] = ("causal_lm", "eagle1", "eagle3", "medusa", "mtp")

ScheduleRule = Literal["none", "contains_one", "smallest_key"]
CudaGraphStyle = Literal["flat", "config", "config_mode"]


# --------------------------------------------------------------------------------------------
# Option tables (generated from the research schema extraction)
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Policy per release
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MethodSpec:
    """How spectool writes one method for one release and backend.

    ``decoding_type`` is the spelling emitted; ``drafter_key`` the ``speculative_config`` key that
    receives the drafter reference (None: no separate drafter, e.g. NGram, or built into the
    engine); ``depth_keys`` every key set to ``max_draft_len``; ``fixed`` further
    ``speculative_config`` fields spectool sets (overridable); ``top_level`` options the
    documented examples pair with the method.
    """

    method: str
    backend: str
    decoding_type: str
    config_class: str
    drafter_key: str | None
    drafter_required: bool
    depth_keys: tuple[str, ...]
    fixed: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    top_level: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    source: str = ""


@dataclass(frozen=True)
class ReleaseInfo:
    """Everything spectool decides per TensorRT-LLM release (see the module docstring)."""

    release: str
    backends: tuple[str, ...]
    default_backend: str
    serve_config_flag: str
    serve_backend_argv: Mapping[str, tuple[str, ...]]
    serve_flags: frozenset[str]
    has_trtllm_build: bool
    methods: Mapping[tuple[str, str], MethodSpec]
    refusals: Mapping[tuple[str, str], str]
    class_backends: Mapping[str, frozenset[str]]
    eagle3_architectures: frozenset[str]
    mtp_architectures: frozenset[str]
    mtp_min_sm: Mapping[str, int]
    trt_eagle_architectures: frozenset[str]
    min_sm: int
    listed_sms: frozenset[int]
    schedule_rule: ScheduleRule
    notes: tuple[str, ...] = ()

    @property
    def schema(self) -> ReleaseSchema:
        return load_schema(self.release)

    def method(self, method: str, backend: str) -> MethodSpec | None:
        return self.methods.get((method, backend))

    def backend_missing_reason(self, backend: str) -> str | None:
        """Why ``backend`` does not exist in this release; None when it does."""
        check_backend(backend)
        if backend in self.backends:
            return None
        return _BACKEND_MISSING.get(
            (self.release, backend),
            f"backend {backend!r} does not exist in TensorRT-LLM {self.release}",
        )

    def unsupported_reason(self, method: str, backend: str) -> str | None:
        """Why ``method`` cannot run on ``backend`` in this release; None when it can."""
        check_method(method)
        missing = self.backend_missing_reason(backend)
        if missing is not None:
            return missing
        if (method, backend) in self.methods:
            return None
        return self.refusals.get(
            (method, backend),
            f"method {method!r} is not available on the {backend} backend of "
            f"TensorRT-LLM {self.release}",
        )

    # Derived from the option table, so they cannot drift from it.
    @property
    def has_max_concurrency(self) -> bool:
        return "max_concurrency" in self._decoding_base_fields()

    @property
    def has_draft_len_schedule(self) -> bool:
        return "draft_len_schedule" in self._decoding_base_fields()

    @property
    def acceptance_gate_keys(self) -> tuple[str, str] | None:
        """The (window, threshold) keys that switch speculation off on low acceptance."""
        base = self._decoding_base_fields()
        for pair in (
            ("acceptance_rate_window_size", "acceptance_rate_threshold"),
            ("acceptance_window", "acceptance_length_threshold"),
        ):
            if pair[0] in base and pair[1] in base:
                return pair
        return None

    @property
    def cuda_graph_style(self) -> CudaGraphStyle:
        torch = self.schema.top_class("pytorch")
        f = torch.fields.get("cuda_graph_config")
        if f is None:
            return "flat"
        return "config_mode" if any(u in f.annotation for u in self.schema.unions) else "config"

    def _decoding_base_fields(self) -> Mapping[str, FieldSpec]:
        base = self.schema.cls("DecodingBaseConfig")
        return base.fields if base else {}


_BACKEND_MISSING = {
    ("main", "tensorrt"): (
        "the TensorRT backend was removed from TensorRT-LLM main (1.4 dev line: TrtLlmArgs, "
        "trtllm-build and `trtllm-serve --backend tensorrt` are gone; "
        "docs/source/legacy/tensorrt-backend-removal.md)"
    ),
}

_PT = "pytorch"
_TRT = "tensorrt"


def _m(
    method: str,
    backend: str,
    decoding_type: str,
    config_class: str,
    drafter_key: str | None,
    depth_keys: tuple[str, ...],
    *,
    drafter_required: bool | None = None,
    fixed: Mapping[str, Any] | None = None,
    top_level: Mapping[str, Any] | None = None,
    source: str = "",
) -> MethodSpec:
    return MethodSpec(
        method=method,
        backend=backend,
        decoding_type=decoding_type,
        config_class=config_class,
        drafter_key=drafter_key,
        drafter_required=drafter_key is not None if drafter_required is None else drafter_required,
        depth_keys=depth_keys,
        fixed=MappingProxyType(dict(fixed or {})),
        top_level=MappingProxyType(dict(top_level or {})),
        source=source,
    )


# The docs' DraftTarget and NGram examples pass disable_overlap_scheduler=True [DOC
# speculative-decoding.md]; spectool writes the same so generated files match the documented ones.
_TWO_MODEL_TOP = {"disable_overlap_scheduler": True}
# NGram: 1.0/1.1 default max_matching_ngram_size is 0 and 0.21's is 4 while 1.2+ default to 2 and
# the docs example uses 2; spectool writes 2 everywhere so the method means the same thing.
_NGRAM_FIXED = {"max_matching_ngram_size": 2}


def _methods(release: str) -> dict[tuple[str, str], MethodSpec]:
    legacy = release in ("0.21", "1.0", "1.1")
    eagle3_type = "Eagle" if legacy else "Eagle3"
    eagle3_cls = "EagleDecodingConfig" if legacy else "Eagle3DecodingConfig"
    dt_type = "DraftTarget" if legacy else "Draft_Target"
    if release == "0.21":
        drafter = "pytorch_weights_path"  # [SRC pre-1.0 llm_args.py: Eagle3Config(draft_model_path=
        trt_drafter = "speculative_model"  #   pytorch_weights_path); ISSUE #5146, #5791]
    elif release == "main":
        drafter = trt_drafter = "speculative_model"
    else:
        drafter = trt_drafter = "speculative_model_dir"
    # MTP depth: num_nextn_predict_layers up to 1.2 (equal to max_draft_len); main deprecates it.
    mtp_depth: tuple[str, ...] = ("max_draft_len",)
    if release != "main":
        mtp_depth += ("num_nextn_predict_layers",)
    ngram_depth = (
        ("max_draft_len", "prompt_lookup_num_tokens") if release == "0.21" else ("max_draft_len",)
    )
    table = [
        _m(
            "eagle3",
            _PT,
            eagle3_type,
            eagle3_cls,
            drafter,
            ("max_draft_len",),
            source="[SRC] 1.0 EagleDecodingConfig.spec_dec_mode → EAGLE3; 1.2+ Eagle3 literal",
        ),
        # EAGLE-1/2 on PyTorch: TensorRT-LLM converts Eagle into Eagle3 (finding EAGLE_ALIAS).
        _m(
            "eagle",
            _PT,
            "Eagle",
            "EagleDecodingConfig",
            drafter,
            ("max_draft_len",),
            source="[SRC] TorchLlmArgs.validate_speculative_config: Eagle → Eagle3 with a warning",
        ),
        _m(
            "draft_model",
            _PT,
            dt_type,
            "DraftTargetDecodingConfig",
            drafter,
            ("max_draft_len",),
            top_level=_TWO_MODEL_TOP,
            source="[SRC] DraftTargetDecodingConfig.supports_backend == pytorch",
        ),
        _m(
            "mtp",
            _PT,
            "MTP",
            "MTPDecodingConfig",
            "speculative_model" if release == "main" else None,
            mtp_depth,
            drafter_required=False,
            source="[SRC] MTPDecodingConfig; main: num_nextn_predict_layers → max_draft_len",
        ),
        _m(
            "ngram",
            _PT,
            "NGram",
            "NGramDecodingConfig",
            None,
            ngram_depth,
            fixed=_NGRAM_FIXED,
            top_level=_TWO_MODEL_TOP,
            source="[SRC] NGramDecodingConfig.supports_backend == pytorch",
        ),
    ]
    if release != "main":
        table += [
            _m(
                "eagle",
                _TRT,
                "Eagle",
                "EagleDecodingConfig",
                trt_drafter,
                ("max_draft_len",),
                drafter_required=release == "1.2",
                source="[SRC] TrtLlmArgs: Eagle → SpeculativeDecodingMode.EAGLE (EAGLE-1/2)",
            ),
            _m(
                "medusa",
                _TRT,
                "Medusa",
                "MedusaDecodingConfig",
                trt_drafter,
                ("max_draft_len",),
                drafter_required=False,
                source="[SRC] MedusaDecodingConfig.supports_backend: not pytorch",
            ),
        ]
    return {(m.method, m.backend): m for m in table}


def _refusals(release: str) -> dict[tuple[str, str], str]:
    out = {
        ("medusa", _PT): (
            "Medusa runs only on the legacy TensorRT backend (MedusaDecodingConfig."
            "supports_backend excludes pytorch)"
        ),
        ("ngram", _TRT): "NGram is PyTorch-only (NGramDecodingConfig.supports_backend == pytorch)",
        ("mtp", _TRT): "MTP is PyTorch-only (MTPDecodingConfig.supports_backend == pytorch)",
        ("draft_model", _TRT): (
            "trtllm-serve's TensorRT backend does not take DraftTarget (PyTorch-only in the LLM "
            "API); the legacy draft_tokens_external engines need Triton's BLS or examples/run.py"
        ),
        ("eagle3", _TRT): (
            "EAGLE-3 runs only on the PyTorch backend (TrtLlmArgs: \"'Eagle3' is only supported "
            "on the PyTorch backend\"); the TensorRT backend's Eagle is EAGLE-1/2"
        ),
    }
    if release == "main":
        out[("medusa", _PT)] = (
            "Medusa was removed with the TensorRT backend; TensorRT-LLM main has no "
            "MedusaDecodingConfig"
        )
    return out


# supports_backend per decoding class [SRC llm_args.py of each generation]; 0.21 asserts the same
# in BaseLlmArgs.validate_speculative_config.
_CLASS_BACKENDS_1X = {
    "MedusaDecodingConfig": frozenset({_TRT}),
    "LookaheadDecodingConfig": frozenset({_TRT}),
    "EagleDecodingConfig": frozenset({_PT, _TRT}),
    "Eagle3DecodingConfig": frozenset({_PT}),
    "NGramDecodingConfig": frozenset({_PT}),
    "DraftTargetDecodingConfig": frozenset({_PT}),
    "MTPDecodingConfig": frozenset({_PT}),
    "AutoDecodingConfig": frozenset({_PT}),
    "PARDDecodingConfig": frozenset({_PT}),
    "UserProvidedDecodingConfig": frozenset({_PT, _TRT}),
    "SaveHiddenStatesDecodingConfig": frozenset({_PT, _TRT}),
}

# Eagle3 targets named in release notes / support matrices [DOC]. The one-model Eagle3 path is
# model-agnostic since 0.21 ("Added model-agnostic one-engine eagle3"), so an unlisted target is a
# warning, not an error.
_EAGLE3_0_21 = frozenset(
    {
        "LlamaForCausalLM",  # Llama 3.x, the documented example (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B)
        "Llama4ForConditionalGeneration",  # 0.20 "Added Eagle-3 support for LLAMA4"
        "Qwen3ForCausalLM",  # 0.21 "Added EAGLE3 support for Qwen-3"; 1.0 "qwen3 dense"
        "Qwen3MoeForCausalLM",
    }
)
_EAGLE3_1_2 = _EAGLE3_0_21 | {"GptOssForCausalLM"}  # support matrix: EAGLE-3 Linear = Yes
_EAGLE3_MAIN = _EAGLE3_1_2 | {
    "DeepseekV3ForCausalLM",  # Eagle3DeepSeekV3ForCausalLM registered [SRC modeling_speculative]
}
# MTP needs the target's own MTP layers and a model class that implements them [DOC
# supported-models; older docs: "MTP is currently only supported by Deepseek"].
_MTP_DEEPSEEK = frozenset({"DeepseekV3ForCausalLM"})
_MTP_1_2 = _MTP_DEEPSEEK | {"DeepseekV32ForCausalLM"}  # 1.2 "Enabled MTP>1 support for DSv3.2"
_MTP_MAIN = _MTP_1_2 | {
    "DeepseekV4ForCausalLM",
    "Glm4MoeForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "NemotronHForCausalLM",
    "Gemma4ForConditionalGeneration",
    "Step3p7ForConditionalGeneration",
}
# MTP example needs the DeepSeek MLA generation kernel: Hopper or newer [DOC 1.3.0rc24 example];
# DeepSeek-V4 needs Blackwell [DOC supported-models footnote].
_MTP_MIN_SM = {"*": 90, "DeepseekV4ForCausalLM": 100}
# TRT EAGLE-1: EagleForCausalLM subclasses the LLaMA model [ISSUE #10396, #2588].
_TRT_EAGLE = frozenset({"LlamaForCausalLM"})

# Support matrix [DOC]: Ampere SM80/86, Ada SM89, Hopper SM90, Blackwell SM100 (0.17), SM120 (0.20
# RTX Pro 6000), SM121 (1.0 "Add support for sm121"), SM103 (1.1 "B300/GB300").
_SMS_0_21 = frozenset({80, 86, 89, 90, 100, 120})
_SMS_1_0 = _SMS_0_21 | {121}
_SMS_1_1 = _SMS_1_0 | {103}

_COMMON_FLAGS = frozenset(
    {
        "--host",
        "--port",
        "--tokenizer",
        "--log_level",
        "--max_beam_width",
        "--max_batch_size",
        "--max_num_tokens",
        "--max_seq_len",
        "--tp_size",
        "--pp_size",
        "--ep_size",
        "--kv_cache_free_gpu_memory_fraction",
        "--extra_llm_api_options",
    }
)


def _info(release: str) -> ReleaseInfo:
    legacy_trt = release != "main"
    if release == "0.21":
        # 0.21's trtllm-serve: `--backend pytorch` selects PyTorch; without it the C++/TRT path
        # runs [DOC trtllm-serve 0.18/0.19: "Set to 'pytorch' for pytorch path. Default is cpp"].
        backend_argv = {_PT: ("--backend", "pytorch"), _TRT: ()}
        default_backend = _TRT
    elif legacy_trt:
        # 1.0 made PyTorch the default of LLM and trtllm-serve [DOC 1.0 release notes].
        backend_argv = {_PT: ("--backend", "pytorch"), _TRT: ("--backend", "tensorrt")}
        default_backend = _PT
    else:
        backend_argv = {_PT: ()}
        default_backend = _PT
    # `--config` appears as the preferred alias of `--extra_llm_api_options` in the 1.2-era
    # serve.py [SRC serve.py @00209af]; 1.1rc docs still show only --extra_llm_api_options.
    config_flag = "--config" if release in ("1.2", "main") else "--extra_llm_api_options"
    flags = set(_COMMON_FLAGS) | {config_flag}
    if legacy_trt:
        flags.add("--backend")
    class_backends = dict(_CLASS_BACKENDS_1X)
    if release == "main":
        class_backends = {k: v & {_PT} for k, v in class_backends.items()}
    return ReleaseInfo(
        release=release,
        backends=(_PT, _TRT) if legacy_trt else (_PT,),
        default_backend=default_backend,
        serve_config_flag=config_flag,
        serve_backend_argv=MappingProxyType(backend_argv),
        serve_flags=frozenset(flags),
        has_trtllm_build=legacy_trt,
        methods=MappingProxyType(_methods(release)),
        refusals=MappingProxyType(_refusals(release)),
        class_backends=MappingProxyType(class_backends),
        eagle3_architectures={"1.2": _EAGLE3_1_2, "main": _EAGLE3_MAIN}.get(release, _EAGLE3_0_21),
        mtp_architectures={"1.2": _MTP_1_2, "main": _MTP_MAIN}.get(release, _MTP_DEEPSEEK),
        mtp_min_sm=MappingProxyType(_MTP_MIN_SM),
        trt_eagle_architectures=_TRT_EAGLE,
        min_sm=80,
        listed_sms={"0.21": _SMS_0_21, "1.0": _SMS_1_0}.get(release, _SMS_1_1),
        # 1.2: "draft_len_schedule must include batch_size=1" and schedule[1] == max_draft_len;
        # main: the smallest key maps to max_draft_len and excludes max_concurrency [SRC].
        schedule_rule={"1.2": "contains_one", "main": "smallest_key"}.get(release, "none"),
        notes=_NOTES.get(release, ()),
    )


_NOTES = {
    "0.21": (
        "Option table derived from 1.0 plus pre-1.0 deltas (no schema extraction of 0.21).",
        "PyTorch Eagle3 and DraftTarget read pytorch_weights_path; NGram prompt_lookup_num_tokens.",
    ),
    "1.2": (
        "draft_len_schedule keys are lower bounds: {1: 4, 4: 2, 8: 0} = bs>=1 → 4, bs>=4 → 2, "
        "bs>=8 → off; key 1 is required and maps to max_draft_len.",
    ),
    "main": (
        "draft_len_schedule keys are upper bounds: {4: 4, 8: 2} = bs 1-4 → 4, 5-8 → 2, 9+ → off; "
        "the smallest key maps to max_draft_len; exclusive with max_concurrency.",
        "cuda_graph_config is a union discriminated on `mode`; spectool writes mode: decode.",
    ),
}


@functools.cache
def release_info(release: str) -> ReleaseInfo:
    """spectool's policy for ``release`` (one of :data:`RELEASES`)."""
    check_release(release)
    return _info(release)


def check_release(release: str) -> None:
    if release not in RELEASES:
        raise ConfigError(
            f"release {release!r}", f"unknown TensorRT-LLM release; known: {', '.join(RELEASES)}"
        )


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ConfigError(
            f"method {method!r}", f"unknown speculative method; known: {', '.join(METHODS)}"
        )


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r}", f"unknown backend; known: {', '.join(BACKENDS)}")


# --------------------------------------------------------------------------------------------
# Installed version → generation
# --------------------------------------------------------------------------------------------

_VERSION_RE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?([.\-+_]?[0-9A-Za-z.+\-_]*)\s*$")


def release_for_version(version: str) -> str:
    """Map an installed ``tensorrt_llm`` version string to the nearest known generation.

    Rule: a version belongs to the generation of its ``major.minor``; pre-releases and dev or post
    builds (``1.2.0rc6``, ``1.1.0.post1``) belong to the same generation, because the option set
    of a release line is fixed during its release candidates. Except 1.3's candidates, mapped by
    date (see ``_release_for_1_3_rc``): rc0-rc7 → ``1.2``, rc8-rc13 refused, rc14 on → ``main``.
    Anything else newer than 1.2 (``1.3.0``, ``1.4.0.dev2026``, 2.x) maps to ``main``, the newest
    source spectool has read. ``0.21.x`` maps
    to ``0.21``; 0.22–0.99 never shipped and map to ``1.0``, the next line. Versions older than
    0.21 are refused (:class:`ConfigError`).
    """
    if version.strip() == "main":
        return "main"
    match = _VERSION_RE.match(version)
    if not match:
        raise ConfigError("tensorrt_llm version", f"cannot parse {version!r}")
    major, minor = int(match.group(1)), int(match.group(2))
    if (major, minor) < (0, 21):
        raise ConfigError(
            "tensorrt_llm version",
            f"{version} is older than 0.21, the oldest TensorRT-LLM spectool supports",
        )
    if major == 0:
        return "0.21" if minor == 21 else "1.0"
    if major == 1 and minor <= 2:
        return f"1.{minor}"
    if (major, minor) == (1, 3):
        rc = re.match(r"^\.?0\.?rc(\d+)", (match.group(3) or "") + match.group(4))
        if rc is not None:
            return _release_for_1_3_rc(version, int(rc.group(1)))
    return "main"


# 1.3 release candidates by date. v1.3.0rc7 was released 2026-03-10 (GitHub release page), three
# days before PR #10860 (one-model dynamic draft length, upper-bound schedule keys) merged on
# 2026-03-13; PR #12905 renamed acceptance_window/acceptance_length_threshold to
# acceptance_rate_window_size/acceptance_rate_threshold in April 2026; v1.3.0rc14 was the newest
# pre-release on 2026-05-18 (NGC image referenced that day). So rc0-rc7 have 1.2's rules, rc14 on
# have main's, and rc8-rc13 fall between the two merges in an order spectool cannot date.
_RC_AS_1_2_UP_TO = 7
_RC_AS_MAIN_FROM = 14


def _release_for_1_3_rc(version: str, rc: int) -> str:
    if rc <= _RC_AS_1_2_UP_TO:
        return "1.2"
    if rc >= _RC_AS_MAIN_FROM:
        return "main"
    raise ConfigError(
        "tensorrt_llm version",
        f"{version} was cut between PR #10860 (2026-03-13: one-model draft_len_schedule, keys "
        "become upper bounds) and PR #12905 (April 2026: acceptance_* fields renamed); spectool "
        "cannot tell which rules it has. Use 1.3.0rc14 or newer, 1.2.x, or pass --trtllm-version "
        "1.2 or main if you know which side it is on",
    )


def detect_installed_version() -> str | None:
    """The installed ``tensorrt_llm`` distribution version, or None when it is not installed."""
    for name in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
