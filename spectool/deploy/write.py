"""Step 3 of ``spectool build``: write a planned build folder atomically (never over a different
build without ``force``) and run the legacy TensorRT engine steps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectool.deploy.manifest import MANIFEST_NAME
from spectool.errors import BadInputError, EngineMissingError, OutputExistsError
from spectool.io import atomic_write_bytes
from spectool.trtllm.engine_build import CKPT_TMP

if TYPE_CHECKING:
    from spectool.deploy.build_request import BuildPlan


def _differing_keys(old: bytes, new: bytes) -> list[str]:
    try:
        a, b = json.loads(old), json.loads(new)
    except ValueError:
        return ["(unreadable manifest.json)"]
    if not isinstance(a, dict) or not isinstance(b, dict):
        return ["(not a manifest)"]
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def existing_build_state(out: Path, manifest_bytes: bytes) -> str:
    """``"absent"`` (no folder or an empty one), ``"identical"`` or ``"different"``."""
    if not out.exists():
        return "absent"
    if not out.is_dir():
        raise OutputExistsError(out, "is a file; choose another --out")
    current = out / MANIFEST_NAME
    if current.is_file():
        return "identical" if current.read_bytes() == manifest_bytes else "different"
    return "different" if any(out.iterdir()) else "absent"


def write_build(plan: BuildPlan, *, force: bool) -> list[Path]:
    """Write the plan's files, then its manifest, atomically; return the paths written.

    An existing folder holding a different build (or anything that is not a spectool build) is
    refused (:class:`OutputExistsError`, exit 2) unless ``force``; an identical build is fine.
    """
    state = existing_build_state(plan.out, plan.manifest_bytes)
    if state == "different" and not force:
        current = plan.out / MANIFEST_NAME
        if current.is_file():
            keys = ", ".join(_differing_keys(current.read_bytes(), plan.manifest_bytes))
            problem = f"holds a different build (differs in: {keys}); pass --force to replace it"
        else:
            problem = "exists and is not a spectool build; pass --force or choose another --out"
        raise OutputExistsError(plan.out, problem)
    if state == "different" and force:
        _remove_stale_files(plan)
    written = [atomic_write_bytes(plan.out / name, data) for name, data in plan.files.items()]
    written.append(atomic_write_bytes(plan.out / MANIFEST_NAME, plan.manifest_bytes))
    return written


def _remove_stale_files(plan: BuildPlan) -> None:
    """Delete files the replaced build listed in its manifest that this build does not write."""
    from spectool.deploy.manifest import read_manifest

    try:
        old = read_manifest(plan.out)
    except BadInputError:
        return
    for name in set(old.files) - set(plan.files):
        target = plan.out / name
        if target.parent == plan.out and target.is_file():
            target.unlink()


def run_engine_steps(plan: BuildPlan, on_output: Any = None) -> None:
    """Run the legacy TensorRT engine steps (conversion, trtllm-build), streaming their output.

    :class:`EngineMissingError` when they cannot run here (the manifest lists them);
    :class:`ChildProcessError_` (exit 3, with the log tail) when one fails.
    """
    from spectool.deploy.supervise import run_to_completion

    if not plan.steps:
        return
    if not plan.steps_runnable:
        raise EngineMissingError(
            f"TensorRT engines not built: convert_checkpoint.py not found; {plan.out / MANIFEST_NAME} "
            "lists the steps (pass --trtllm-examples DIR, the examples folder of the TensorRT-LLM "
            "checkout matching the installed version)"
        )
    for step in plan.steps:
        run_to_completion(step.argv, name=step.name, on_output=on_output)
    shutil.rmtree(plan.out / CKPT_TMP, ignore_errors=True)
