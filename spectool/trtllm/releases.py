"""What spectool knows about each TensorRT-LLM release, in one place.

Releases (generations) spectool supports: ``0.21``, ``1.0``, ``1.1``, ``1.2`` (1.2.x) and ``main``
(the newest main seen in source, commit 0004396, after 1.3.0rc29: the TensorRT backend is gone).

Two kinds of knowledge, two modules:

* **Option tables** (:func:`load_schema`, in :mod:`spectool.trtllm.options`): every LLM-API
  config class of a release, its fields, types, defaults and accepted keys. They are generated from the research extraction of
  ``tensorrt_llm/llmapi/llm_args.py`` by ``scripts/extract_trtllm_schema.py`` and shipped as
  ``spectool/trtllm/schema/<release>.json``. 0.21 has no extraction of its own: it is 1.0 plus
  the deltas read in a pre-1.0 llm_args.py (see the script), so it is approximate outside
  ``speculative_config``.
* **Policy** (:func:`release_info`, here; per method in :mod:`spectool.trtllm.method_specs`):
  which ``decoding_type`` spelling and which drafter key spectool writes per method, which backends and methods exist, ``trtllm-serve`` flags, architectures
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
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from spectool import methods
from spectool.errors import ConfigError

# Option tables and version mapping live in their own modules; their names stay importable here.
from spectool.trtllm.method_specs import MethodSpec, method_refusals, method_specs
from spectool.trtllm.options import (
    RELEASES,
    ClassSpec,
    FieldSpec,
    ReleaseSchema,
    SpeculativeDispatch,
    UnionSpec,
    check_release,
    load_schema,
)
from spectool.trtllm.versions import detect_installed_version, release_for_version

__all__ = [
    "BACKENDS",
    "DRAFTER_KINDS",
    "METHODS",
    "RELEASES",
    "ClassSpec",
    "FieldSpec",
    "MethodSpec",
    "ReleaseInfo",
    "ReleaseSchema",
    "SpeculativeDispatch",
    "UnionSpec",
    "check_backend",
    "check_method",
    "check_release",
    "detect_installed_version",
    "load_schema",
    "release_for_version",
    "release_info",
]

# The universe of method names is spectool.methods'; which release runs which is decided here.
METHODS: tuple[str, ...] = methods.METHODS
BACKENDS: tuple[str, ...] = ("pytorch", "tensorrt")
DRAFTER_KINDS: tuple[str, ...] = ("causal_lm", "eagle1", "eagle3", "medusa", "mtp")

ScheduleRule = Literal["none", "contains_one", "smallest_key"]
CudaGraphStyle = Literal["flat", "config", "config_mode"]


# --------------------------------------------------------------------------------------------
# Policy per release
# --------------------------------------------------------------------------------------------


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

# PyTorch releases that load the draft model from a local folder only: PR #10099 ("Auto download
# speculative models from HF for pytorch backend", merged 2025-12-18) says "for the PyTorch /
# AutoDeploy backends, the draft model for speculative decoding needs to be provided as a local
# path"; it shipped with 1.2 (speculative_model with alias speculative_model_dir, v1.2.json).
LOCAL_DRAFTER_RELEASES = frozenset({"0.21", "1.0", "1.1"})


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
        # every stored serve.py with --ep_size has it too (e.g. tensorrt_llm/commands/serve.py
        # @00209af: "Number of GPUs per node. Default to None, and it will be detected")
        "--gpus_per_node",
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
        methods=MappingProxyType(method_specs(release)),
        refusals=MappingProxyType(method_refusals(release)),
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


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ConfigError(
            f"method {method!r}", f"unknown speculative method; known: {', '.join(METHODS)}"
        )


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r}", f"unknown backend; known: {', '.join(BACKENDS)}")
