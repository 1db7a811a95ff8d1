"""What ``spectool build`` was asked and what each of its steps hands the next: the request, the
GPU it is fitted to, the checked inputs and the rendered plan (:mod:`spectool.deploy.build`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from spectool.check import CheckReport, PairOptions
from spectool.deploy.decision import Decision
from spectool.deploy.manifest import EngineStep, Manifest
from spectool.gpu import DetectedGpu
from spectool.profiles import GpuSpec


@dataclass(frozen=True)
class BuildRequest(PairOptions):
    """Everything ``spectool build`` was asked (see the CLI for each option's meaning): the
    options ``check`` shares, and where and how to build."""

    out: Path = Path("build")
    engine: str = "trtllm"
    decision: Path | None = None
    force: bool = False
    trust_remote_code: bool = False
    trtllm_examples: Path | None = None
    # Where the release would ignore a runtime gate: "serve" (no gate; serve's cost gate picks
    # the baseline above break-even) or "two-model" (EAGLE-3 two-model, where it is honoured).
    inert_gate: str = "serve"
    download: bool = False
    # MTP on TensorRT-LLM: (relaxed_topk, relaxed_delta) writes use_relaxed_acceptance_for_thinking,
    # which accepts drafts the target did not pick (lossy); never written unless asked.
    mtp_relaxed_acceptance: tuple[int, float] | None = None


@dataclass(frozen=True)
class BuildGpu:
    """The GPU a build is fitted to (``spec``: spectool's table entry) and what was detected."""

    spec: GpuSpec | None
    detected: tuple[DetectedGpu, ...]


@dataclass(frozen=True)
class BuildInputs:
    """The outcome of :func:`check_build`: the checker's report and what the build rests on."""

    request: BuildRequest
    report: CheckReport
    gpu: BuildGpu
    decision: Decision | None
    decision_bytes: bytes | None


@dataclass(frozen=True)
class BuildPlan:
    """Every file of the build folder, rendered and validated, and the engine steps to run."""

    out: Path
    files: dict[str, bytes]
    manifest: Manifest
    notes: tuple[str, ...]
    steps: tuple[EngineStep, ...] = ()
    steps_runnable: bool = True
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def manifest_bytes(self) -> bytes:
        return self.manifest.to_bytes()
