"""Legacy TensorRT backend: the commands that build a build folder's two TensorRT engines.

Releases up to 1.2 can serve prebuilt TensorRT engines (``trtllm-serve ENGINE_DIR``). An engine
is made in two steps per variant: the model family's ``convert_checkpoint.py`` (EAGLE and Medusa
have their own, which also take the draft heads) writes a TensorRT-LLM checkpoint, then
``trtllm-build`` compiles it for the GPU it runs on. spectool plans both variants, the
speculative engine (``--speculative_decoding_mode``, ``--max_draft_len``) into ``DIR/engine`` and
the baseline into ``DIR/baseline-engine``; :func:`spectool.deploy.build.run_engine_steps` runs
them. An engine only loads on the GPU architecture and TensorRT(-LLM) version that built it.

The conversion scripts live in the TensorRT-LLM repository's ``examples`` folder, not in the
wheel; when it cannot be found the steps are recorded in the manifest, not run.
"""

from __future__ import annotations

import sys
from pathlib import Path

from spectool.check import CheckReport
from spectool.ckpt.inspect import Checkpoint
from spectool.deploy.launch import BASELINE_ENGINE_DIR, ENGINE_DIR
from spectool.deploy.manifest import EngineStep, LimitsRecord, model_ref
from spectool.errors import BadInputError

# The NGC TensorRT-LLM release container keeps the repository's examples here [INFER: release
# Dockerfile layout]; pass --trtllm-examples elsewhere.
CONTAINER_EXAMPLES = Path("/app/tensorrt_llm/examples")
# model_type -> the examples subfolder holding its convert_checkpoint.py (1.x layout, then 0.x).
CONVERT_FAMILIES: dict[str, tuple[str, ...]] = {
    "llama": ("models/core/llama", "llama"),
    "mistral": ("models/core/llama", "llama"),
    "qwen2": ("models/core/qwen", "qwen"),
    "qwen3": ("models/core/qwen", "qwen"),
    "gemma": ("models/core/gemma", "gemma"),
    "gemma2": ("models/core/gemma", "gemma"),
}
SPEC_CONVERT = {"eagle": "eagle", "medusa": "medusa"}
CKPT_TMP = ".trtllm-checkpoints"


def examples_root(explicit: Path | None) -> Path | None:
    """The TensorRT-LLM examples folder: ``explicit`` (must exist), else the container's."""
    if explicit is not None:
        root = Path(explicit).expanduser()
        if not root.is_dir():
            raise BadInputError("--trtllm-examples", f"{root} is not a folder")
        return root.resolve()
    return CONTAINER_EXAMPLES if CONTAINER_EXAMPLES.is_dir() else None


def _script(root: Path | None, subfolders: tuple[str, ...]) -> tuple[str, bool]:
    """(convert_checkpoint.py path, found) under ``root``; a placeholder path when not found."""
    for sub in subfolders:
        if root is not None and (root / sub / "convert_checkpoint.py").is_file():
            return str(root / sub / "convert_checkpoint.py"), True
    base = str(root) if root is not None else "$TRTLLM_EXAMPLES"
    return f"{base}/{subfolders[0]}/convert_checkpoint.py", False


def _convert_dtype(ckpt: Checkpoint) -> str:
    dtype = ckpt.config_dtype or "float16"
    return dtype if dtype in ("float16", "bfloat16", "float32") else "float16"


def engine_steps(
    report: CheckReport,
    *,
    out: Path,
    limits: LimitsRecord,
    tp: int,
    examples: Path | None,
) -> tuple[tuple[EngineStep, ...], bool, list[str]]:
    """Checkpoint conversion and ``trtllm-build`` for the speculative and the baseline engine.

    Returns (steps, all runnable here, notes). :class:`EngineMissingError` without
    ``trtllm-build``. The conversion script is per model family and lives in the TensorRT-LLM
    repository's ``examples`` (not in the wheel): ``--trtllm-examples``, else the release
    container's :data:`CONTAINER_EXAMPLES`; when absent, the steps are recorded, not run.
    EAGLE-1 as TensorRT-LLM's examples/eagle/README.md (@06255cb) builds it: conversion with
    ``--max_draft_len 63 --num_eagle_layers 4`` (a draft tree of up to 63 tokens, depth 4) and
    ``trtllm-build --speculative_decoding_mode eagle`` without ``--max_draft_len``; the tree
    itself (``eagle_choices``) is chosen at run time, so ``--max-draft-len`` is not a build-time
    setting there (a note says so).
    """
    from spectool.trtllm.launch import (
        EAGLE1_LAYERS,
        EAGLE1_TREE_NODES,
        build_mode_for_method,
        build_trtllm_build_argv,
        find_trtllm_build,
    )

    assert report.trtllm is not None
    release = report.trtllm["release"]
    trtllm_build = find_trtllm_build()
    root = examples_root(examples)
    family = CONVERT_FAMILIES.get(report.target.model_type or "")
    notes: list[str] = []
    if family is None:
        raise BadInputError(
            "--trtllm-backend tensorrt",
            f"spectool knows no convert_checkpoint.py for model_type {report.target.model_type!r}; "
            "use the PyTorch backend",
        )
    dtype = _convert_dtype(report.target)
    k = report.max_draft_len
    ckpt_base = out / CKPT_TMP / "baseline"
    ckpt_spec = out / CKPT_TMP / "speculative"
    base_script, base_found = _script(root, family)
    spec_script, spec_found = _script(root, (SPEC_CONVERT[report.method],))
    python = sys.executable
    common = ["--dtype", dtype, "--tp_size", str(tp)]
    convert_base = [python, base_script, "--model_dir", model_ref(report.target)]
    convert_base += ["--output_dir", str(ckpt_base), *common]
    convert_spec = [python, spec_script, "--model_dir", model_ref(report.target)]
    assert report.drafter is not None, "TensorRT engine methods have a drafter"
    if report.method == "eagle":
        convert_spec += ["--eagle_model_dir", model_ref(report.drafter)]
        convert_spec += ["--max_draft_len", str(EAGLE1_TREE_NODES)]
        convert_spec += ["--num_eagle_layers", str(EAGLE1_LAYERS)]
        notes.append(
            f"legacy EAGLE-1 engine: converted as examples/eagle/README.md does (a draft tree of "
            f"up to {EAGLE1_TREE_NODES} tokens, {EAGLE1_LAYERS} EAGLE layers) and built without "
            f"--max_draft_len; the tree is chosen at run time (eagle_choices), so --max-draft-len "
            f"{k} does not change the engine"
        )
    else:
        heads = report.drafter.config.get("medusa_num_heads") or report.drafter.medusa_heads or 4
        convert_spec += ["--medusa_model_dir", model_ref(report.drafter)]
        convert_spec += ["--num_medusa_heads", str(heads), "--max_draft_len", str(k)]
    convert_spec += ["--output_dir", str(ckpt_spec), *common]
    sizes = {
        "max_batch_size": limits.max_batch_size,
        "max_seq_len": limits.max_seq_len,
        "max_num_tokens": limits.max_num_tokens,
    }
    build_spec = build_trtllm_build_argv(
        release=release,
        checkpoint_dir=ckpt_spec,
        output_dir=out / ENGINE_DIR,
        speculative_decoding_mode=build_mode_for_method(report.method),
        max_draft_len=None if report.method == "eagle" else k,
        executable=trtllm_build,
        **sizes,
    )
    build_base = build_trtllm_build_argv(
        release=release,
        checkpoint_dir=ckpt_base,
        output_dir=out / BASELINE_ENGINE_DIR,
        speculative_decoding_mode=None,
        executable=trtllm_build,
        **sizes,
    )
    steps = (
        EngineStep(name="convert speculative checkpoint", argv=tuple(convert_spec)),
        EngineStep(name="trtllm-build speculative engine", argv=tuple(build_spec)),
        EngineStep(name="convert baseline checkpoint", argv=tuple(convert_base)),
        EngineStep(name="trtllm-build baseline engine", argv=tuple(build_base)),
    )
    runnable = base_found and spec_found
    if not runnable:
        notes.append(
            "engines not built: convert_checkpoint.py was not found (pass --trtllm-examples, the "
            "examples folder of a TensorRT-LLM checkout of the installed version); the steps "
            "are in manifest.json"
        )
    return steps, runnable, notes
