"""How spectool writes each speculation method for each TensorRT-LLM release and backend, and
why a method is refused where it cannot run. The method names are :mod:`spectool.methods`';
sources are cited with the tags of :mod:`spectool.trtllm.releases`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


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


def method_specs(release: str) -> dict[tuple[str, str], MethodSpec]:
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


def method_refusals(release: str) -> dict[tuple[str, str], str]:
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
