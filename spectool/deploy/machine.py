"""Does this machine match a build? Compare a manifest with the GPU, engine and files here.

Why: a build is fitted to one GPU and one TensorRT-LLM generation. A legacy TensorRT engine runs
only on the GPU architecture and the TensorRT(-LLM) version that built it; a PyTorch-backend
config carries KV-cache and batch limits sized for the GPU's memory. Serving on another machine
would crash at load time or waste (or overrun) memory, so ``serve`` refuses with the reason.

:func:`machine_problems` is pure (facts in, problems out); :func:`current_machine` and
:func:`engine_dir_problems` read this machine and the build folder.
"""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path

from spectool.deploy.manifest import Manifest, file_sha256
from spectool.errors import ConfigError
from spectool.gpu import DetectedGpu

GIB = 1024**3
# nvidia-smi reports a little less than the marketed capacity (H100: 79.6 of 80 GiB).
MEMORY_SHORTFALL_TOLERANCE = 0.90
MEMORY_SURPLUS_WARNING = 1.25
TENSORRT_DISTRIBUTIONS = ("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt-cu11")


@dataclass(frozen=True)
class MachineFacts:
    """What this machine has: GPUs as the driver reports them, installed engine versions."""

    gpus: tuple[DetectedGpu, ...]
    trtllm_version: str | None
    tensorrt_version: str | None


@dataclass(frozen=True)
class MachineCheck:
    """Problems that forbid serving the build here (``errors``) and ones worth knowing."""

    errors: tuple[str, ...]
    warnings: tuple[str, ...]


def detect_tensorrt_version() -> str | None:
    """The installed TensorRT Python distribution's version, or None."""
    for name in TENSORRT_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def current_machine() -> MachineFacts:
    from spectool.gpu import detect_gpus
    from spectool.trtllm.releases import detect_installed_version

    return MachineFacts(
        gpus=tuple(detect_gpus()),
        trtllm_version=detect_installed_version(),
        tensorrt_version=detect_tensorrt_version(),
    )


def _gpu_label(manifest: Manifest) -> str:
    g = manifest.gpu
    return f"{g.name} (SM{g.sm}, {g.memory_gib:g} GiB)" if g.name else "no GPU"


def _gpu_problems(manifest: Manifest, gpus: tuple[DetectedGpu, ...]) -> tuple[list[str], list[str]]:
    errors: list[str] = []
    warnings: list[str] = []
    built = manifest.gpu
    legacy = manifest.trtllm is not None and manifest.trtllm.backend == "tensorrt"
    # The embedded engine runs anywhere (CPU too); its limits are advice, not a hard fit.
    hard = errors if manifest.engine == "trtllm" else warnings
    if built.sm is None:
        return errors, warnings
    if not gpus:
        hard.append(
            f"no NVIDIA GPU found here (NVML, nvidia-smi); the build is for {_gpu_label(manifest)}"
        )
        return errors, warnings
    if len(gpus) < manifest.tp:
        hard.append(f"the build uses tp={manifest.tp} but {len(gpus)} GPU(s) were found here")
    here = gpus[0]
    sm = here.sm if here.sm is not None else (here.spec.sm if here.spec else None)
    if sm is None:
        warnings.append(f"cannot read the compute capability of {here.name}; not compared")
    elif sm != built.sm:
        why = (
            "a TensorRT engine runs only on the GPU architecture it was built for"
            if legacy
            else "its memory limits and kernels were chosen for that GPU"
        )
        hard.append(
            f"this machine has {here.name} (SM{sm}); the build is for {_gpu_label(manifest)}: "
            f"{why}; rebuild here with spectool build"
        )
    if here.memory_total_bytes is not None and built.memory_gib is not None:
        have_gib = here.memory_total_bytes / GIB
        if have_gib < built.memory_gib * MEMORY_SHORTFALL_TOLERANCE:
            hard.append(
                f"{here.name} has {have_gib:.1f} GiB; the build's KV-cache and batch limits were "
                f"fitted to {built.memory_gib:g} GiB and would not fit; rebuild here"
            )
        elif have_gib > built.memory_gib * MEMORY_SURPLUS_WARNING:
            warnings.append(
                f"{here.name} has {have_gib:.0f} GiB, more than the {built.memory_gib:g} GiB the "
                "build was fitted to; rebuild here to use it"
            )
    return errors, warnings


def _trtllm_problems(manifest: Manifest, facts: MachineFacts) -> tuple[list[str], list[str]]:
    from spectool.trtllm.releases import release_for_version

    errors: list[str] = []
    warnings: list[str] = []
    t = manifest.trtllm
    if t is None:
        return errors, warnings
    built = f"TensorRT-LLM {t.release}" + (f" ({t.version})" if t.version else "")
    installed = facts.trtllm_version
    if installed is None:
        warnings.append(
            f"cannot tell which TensorRT-LLM is installed (no tensorrt_llm distribution); the "
            f"build is for {built}"
        )
        return errors, warnings
    try:
        release = release_for_version(installed)
    except ConfigError as exc:
        errors.append(f"installed TensorRT-LLM {installed}: {exc.problem}")
        return errors, warnings
    if release != t.release:
        errors.append(
            f"installed TensorRT-LLM {installed} is generation {release}; the build is for "
            f"{built}: its YAML keys differ between generations; rebuild with spectool build"
        )
    elif t.backend == "tensorrt" and t.version is not None and t.version != installed:
        errors.append(
            f"the TensorRT engines were built with TensorRT-LLM {t.version}, installed is "
            f"{installed}: engines only load in the version that built them; rebuild"
        )
    if (
        t.backend == "tensorrt"
        and t.tensorrt_version is not None
        and facts.tensorrt_version is not None
        and t.tensorrt_version != facts.tensorrt_version
    ):
        errors.append(
            f"the TensorRT engines were built with TensorRT {t.tensorrt_version}, installed is "
            f"{facts.tensorrt_version}; rebuild"
        )
    return errors, warnings


def checkpoint_problems(manifest: Manifest) -> list[str]:
    errors: list[str] = []
    for role, rec in (("target", manifest.target), ("drafter", manifest.drafter)):
        if rec is None or rec.path is None:  # not read at build time: nothing to compare
            continue
        config = Path(rec.path) / "config.json"
        local = Path(rec.ref).is_absolute()
        if not config.is_file():
            if local or manifest.engine == "torch":
                errors.append(f"the {role} {rec.ref} is gone (no {config})")
            continue
        if file_sha256(config) != rec.config_sha256:
            errors.append(
                f"the {role}'s config.json ({config}) changed since the build; rebuild so the "
                "build matches the model"
            )
    return errors


def machine_problems(manifest: Manifest, facts: MachineFacts) -> MachineCheck:
    """Everything about ``facts`` (this machine) that does not match ``manifest``.

    Checks: GPU present, count >= tp, same SM, enough memory; the installed TensorRT-LLM is the
    generation built for (the exact version, and the same TensorRT, for legacy engines); the
    checkpoints' config.json unchanged (local folders). The embedded engine's GPU mismatches are
    warnings: it runs anywhere.
    """
    errors, warnings = _gpu_problems(manifest, facts.gpus)
    if manifest.engine == "trtllm":
        e, w = _trtllm_problems(manifest, facts)
        errors += e
        warnings += w
    errors += checkpoint_problems(manifest)
    return MachineCheck(tuple(errors), tuple(warnings))


def _engine_dir_problem(folder: Path, tp: int, installed: str | None) -> str | None:
    config = folder / "config.json"
    if not config.is_file():
        return f"no TensorRT engine in {folder}"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{config} cannot be read: {exc}"
    version = data.get("version") if isinstance(data, dict) else None
    if installed is not None and isinstance(version, str) and version != installed:
        return (
            f"the engine in {folder} was built by TensorRT-LLM {version}, installed is {installed}"
        )
    missing = [f"rank{r}.engine" for r in range(tp) if not (folder / f"rank{r}.engine").is_file()]
    if missing:
        return f"{folder} lacks {', '.join(missing)}"
    return None


def engine_dir_problems(build_dir: Path, manifest: Manifest, facts: MachineFacts) -> list[str]:
    """Legacy TensorRT backend: are both engines present and built by the installed version?"""
    record = manifest.engine_build
    if record is None:
        return []
    hint = "run the engine steps in manifest.json (or spectool build) on this machine"
    problems = []
    for rel in (record.engine_dir, record.baseline_engine_dir):
        problem = _engine_dir_problem(build_dir / rel, manifest.tp, facts.trtllm_version)
        if problem is not None:
            problems.append(f"{problem}; {hint}")
    return problems


def changed_files(build_dir: Path, manifest: Manifest) -> list[str]:
    """Files of the build whose sha256 no longer matches the manifest (edited or missing)."""
    changed = []
    for name, digest in manifest.files.items():
        path = build_dir / name
        if not path.is_file() or file_sha256(path) != digest:
            changed.append(name)
    return changed
