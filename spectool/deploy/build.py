"""``spectool build`` as library calls: check, fit to the GPU, render, write a build folder.

Three steps, so the command can show the checker's findings and stop before anything is written:

1. :func:`check_build` resolves the GPU (``--gpu auto`` asks NVML, then nvidia-smi), reads the
   tune decision, and runs :func:`spectool.check.run_check`.
2. :func:`plan_build` fits limits to the GPU and renders every file in memory (validated): for
   TensorRT-LLM ``speculative.yaml`` (extra LLM-API options for ``trtllm-serve --config``) and
   ``baseline.yaml`` (the same without speculation, for A/B and the cost gate); for the embedded
   engine ``speculative.json`` and ``baseline.json`` (its EngineConfig); a copy of the decision;
   and ``manifest.json``.
3. :func:`write_build` writes them atomically, refusing to replace a different build without
   ``force``; :func:`run_engine_steps` runs the legacy TensorRT engine commands planned by
   :mod:`spectool.trtllm.engine_build` where that backend is used.

The parts of step 2 have their own modules: :mod:`spectool.deploy.limits` (batch, token and
KV-cache limits fitted to the GPU), :mod:`spectool.deploy.runtime_gate` (the decision as the
engine's runtime gate) and :mod:`spectool.deploy.render` (the config files); step 3 is
:mod:`spectool.deploy.write`.
"""

from __future__ import annotations

from pathlib import Path

from spectool import __version__, methods
from spectool.check import CheckReport, run_check
from spectool.ckpt.inspect import Checkpoint
from spectool.deploy import launch
from spectool.deploy.build_request import BuildGpu, BuildInputs, BuildPlan, BuildRequest
from spectool.deploy.decision import Decision, read_decision
from spectool.deploy.limits import TORCH_DEFAULT_MAX_SEQ_LEN, fit_limits
from spectool.deploy.machine import detect_tensorrt_version
from spectool.deploy.manifest import (
    CONFIG_FILES,
    DECISION_NAME,
    CheckpointRecord,
    CommandsRecord,
    DecisionRecord,
    EngineBuildRecord,
    EngineStep,
    GpuRecord,
    Manifest,
    ParallelRecord,
    TrtllmRecord,
    checkpoint_record,
    model_ref,
    reproducible_ref,
    sha256_hex,
)
from spectool.deploy.render import json_bytes, torch_engine_configs, trtllm_files
from spectool.deploy.runtime_gate import plan_runtime_gate
from spectool.deploy.write import existing_build_state, run_engine_steps, write_build
from spectool.errors import BadInputError
from spectool.gpu import DetectedGpu
from spectool.inputs import check_pair_options
from spectool.trtllm.engine_build import engine_steps

__all__ = [
    "BuildGpu",
    "BuildInputs",
    "BuildPlan",
    "BuildRequest",
    "build_argv",
    "check_build",
    "existing_build_state",
    "model_ref",
    "parse_relaxed_acceptance",
    "plan_build",
    "resolve_build_gpu",
    "run_engine_steps",
    "write_build",
]

ENGINES = ("trtllm", "torch")
RELAXED_FLAG = "--mtp-relaxed-acceptance"


def parse_relaxed_acceptance(text: str | None) -> tuple[int, float] | None:
    """``"10,0.6"`` -> ``(10, 0.6)`` (relaxed_topk >= 1, relaxed_delta >= 0); None stays None."""
    if text is None:
        return None
    parts = text.split(",")
    try:
        topk, delta = int(parts[0]), float(parts[1])
    except (IndexError, ValueError):
        raise BadInputError(
            RELAXED_FLAG, f"expected TOPK,DELTA such as 10,0.6, got {text!r}"
        ) from None
    if len(parts) != 2 or topk < 1 or not delta >= 0:
        raise BadInputError(
            RELAXED_FLAG, f"TOPK must be >= 1 and DELTA >= 0 (e.g. 10,0.6), got {text!r}"
        )
    return topk, delta


def relaxed_options(req: BuildRequest) -> dict[str, object]:
    """The ``speculative_config`` fields of MTP's relaxed acceptance, when asked for."""
    if req.mtp_relaxed_acceptance is None:
        return {}
    topk, delta = req.mtp_relaxed_acceptance
    return {
        "use_relaxed_acceptance_for_thinking": True,
        "relaxed_topk": topk,
        "relaxed_delta": delta,
    }


# ---- step 1: check -----------------------------------------------------------------------------


def resolve_build_gpu(
    arg: str | None, engine: str, detected: list[DetectedGpu] | None = None
) -> BuildGpu:
    """The GPU to fit to: ``--gpu NAME`` from the table, or the first detected GPU.

    TensorRT-LLM builds need one: with no GPU detected (or one spectool's table lacks) a name is
    required (:class:`BadInputError`, exit 2). The embedded engine also runs on a CPU: None then.
    """
    from spectool.gpu import detect_gpus
    from spectool.profiles import list_gpus, load_gpu

    found = tuple(detect_gpus() if detected is None else detected)
    if arg is not None and arg.strip().lower() not in ("", "auto"):
        return BuildGpu(load_gpu(arg), found)
    if found and found[0].spec is not None:
        return BuildGpu(found[0].spec, found)
    if engine == "torch":
        return BuildGpu(None, found)
    known = ", ".join(list_gpus())
    if found:
        raise BadInputError(
            "--gpu",
            f"detected {found[0].name}, which spectool's GPU table does not know; pass --gpu NAME "
            f"of the closest GPU ({known})",
        )
    raise BadInputError(
        "--gpu", f"no NVIDIA GPU found (NVML, nvidia-smi); pass --gpu NAME, one of: {known}"
    )


def check_build(req: BuildRequest) -> BuildInputs:
    """Resolve GPU and decision, then run the checker for the pair the build is for."""
    if req.engine not in ENGINES:
        raise BadInputError("--engine", f"expected one of {', '.join(ENGINES)}, got {req.engine!r}")
    check_pair_options(req)  # bad input (exit 2) before the GPU is looked for
    if not req.plain_tp and (req.engine != "trtllm" or req.trtllm_backend != "pytorch"):
        # the embedded engine runs on one GPU; the legacy engine build plans TP only
        where = "--engine torch" if req.engine != "trtllm" else "the tensorrt backend"
        raise BadInputError(
            "--pp/--ep/--attention-dp/--nodes",
            f"parallel layouts are built for TensorRT-LLM's PyTorch backend, not {where}",
        )
    decision: Decision | None = None
    decision_bytes: bytes | None = None
    if req.decision is not None:
        decision, decision_bytes = read_decision(req.decision)
    gpu = resolve_build_gpu(req.gpu, req.engine)
    max_draft_len = req.max_draft_len
    if decision is not None and decision.max_draft_len > 0:
        if max_draft_len is not None and max_draft_len != decision.max_draft_len:
            raise BadInputError(
                "--max-draft-len",
                f"{max_draft_len} differs from the decision's max_draft_len "
                f"{decision.max_draft_len} (its k at the smallest concurrency); drop one",
            )
        max_draft_len = decision.max_draft_len
    max_seq_len = req.max_seq_len
    if req.engine == "torch" and max_seq_len is None:
        max_seq_len = TORCH_DEFAULT_MAX_SEQ_LEN
    report = run_check(
        req.check_request(
            req.engine,
            max_draft_len=max_draft_len,
            gpu=gpu.spec.name if gpu.spec is not None else "auto",
            max_seq_len=max_seq_len,
        )
    )
    if report.target is None and (req.engine != "trtllm" or req.trtllm_backend != "pytorch"):
        raise BadInputError(
            report.extra.get("target_ref", "target"),
            f"headers unavailable ({report.unread}); only TensorRT-LLM's PyTorch backend is "
            "built from a profile's geometry alone: run once online or pass local folders",
        )
    if req.mtp_relaxed_acceptance is not None and (
        report.method != "mtp" or req.engine != "trtllm"
    ):
        raise BadInputError(
            RELAXED_FLAG,
            f"applies to method mtp on TensorRT-LLM only, not {report.method} on {req.engine}",
        )
    if decision is not None and decision.method and decision.method != report.method:
        raise BadInputError(
            req.decision,
            f"the decision measured method {decision.method}, this build is {report.method}",
        )
    return BuildInputs(req, report, gpu, decision, decision_bytes)


# ---- step 2: plan ------------------------------------------------------------------------------


def build_argv(inputs: BuildInputs, out: Path) -> tuple[str, ...]:
    """The ``spectool build`` command line that reproduces this build (resolved values)."""
    req, report = inputs.request, inputs.report
    target, drafter = _model_refs(report)  # offline from a profile: its repo ids
    if report.target is not None:
        target = reproducible_ref(report.target)
        drafter = reproducible_ref(report.drafter) if report.drafter is not None else None
    argv = ["spectool", "build", target]
    if drafter is not None:
        argv.append(drafter)
    elif methods.get(report.method).uses_native_layers:
        argv.append("self")
    if report.target is None:
        argv += ["--profile", str(report.profile)]
    argv += ["--engine", req.engine, "--method", report.method]
    argv += ["--max-draft-len", str(report.max_draft_len), "--out", str(out)]
    if req.engine == "trtllm":
        assert report.trtllm is not None
        version = report.trtllm["version"] or report.trtllm["release"]
        argv += ["--trtllm-version", str(version), "--trtllm-backend", req.trtllm_backend]
    if inputs.gpu.spec is not None:
        argv += ["--gpu", inputs.gpu.spec.name]
    argv += ["--tp", str(req.tp)]
    if not req.plain_tp:
        layout = req.layout()
        argv += ["--pp", str(layout.pp), "--ep", str(layout.ep)]
        argv += ["--nodes", str(layout.nodes), "--gpus-per-node", str(layout.gpus_per_node)]
        if layout.attention_dp:
            argv.append("--attention-dp")
    if req.max_batch_size is not None:
        argv += ["--max-batch-size", str(req.max_batch_size)]
    if req.max_seq_len is not None:
        argv += ["--max-seq-len", str(req.max_seq_len)]
    if req.decision is not None:
        argv += ["--decision", str(Path(req.decision).resolve())]
    if req.mtp_relaxed_acceptance is not None:
        topk, delta = req.mtp_relaxed_acceptance
        argv += [RELAXED_FLAG, f"{topk},{delta:g}"]
    if req.trust_remote_code:
        argv.append("--trust-remote-code")
    return tuple(argv)


def _gpu_record(gpu: BuildGpu) -> GpuRecord:
    here = gpu.detected[0] if gpu.detected else None
    spec = gpu.spec
    return GpuRecord(
        name=spec.name if spec else None,
        sm=spec.sm if spec else None,
        memory_gib=spec.memory_gib if spec else None,
        device_name=here.name if here else None,
        driver=(here.driver_version or None) if here else None,
        count=len(gpu.detected),
    )


def _decision_record(inputs: BuildInputs) -> DecisionRecord | None:
    if inputs.decision is None or inputs.decision_bytes is None:
        return None
    summary = inputs.decision.summary()
    source = Path(inputs.request.decision or "").resolve()
    out = Path(inputs.request.out).expanduser().resolve()
    # relative to the build folder when it lies inside (a tune folder moves as a whole)
    shown = source.relative_to(out) if source.is_relative_to(out) else source
    return DecisionRecord(
        source=str(shown),
        sha256=sha256_hex(inputs.decision_bytes),
        **summary,
    )


def plan_build(inputs: BuildInputs) -> BuildPlan:
    """Render every file of the build folder (validated) and its manifest; writes nothing.

    The check must have passed (no errors). Raises :class:`ConfigError` when the release
    cannot express the build, :class:`EngineMissingError` when the legacy TensorRT backend's
    ``trtllm-build`` is not installed.
    """
    req, report = inputs.request, inputs.report
    assert not report.errors, "plan_build needs a check without errors"
    out = Path(req.out).expanduser().resolve()
    limits = fit_limits(inputs)
    gate = plan_runtime_gate(inputs, limits)
    notes = list(gate.notes)
    warnings: list[str] = []
    target_model, drafter_model = _model_refs(report)
    if report.target is None:
        notes.append(
            f"built offline from profile {report.profile}'s geometry: the checkpoints were not "
            "read (checkpoint rules and the architecture's engine rules did not run); "
            "trtllm-serve reads them on the nodes"
        )
    files: dict[str, bytes] = {}
    parallel: ParallelRecord | None = None
    trtllm: TrtllmRecord | None = None
    steps: tuple[EngineStep, ...] = ()
    runnable = True
    if req.engine == "trtllm":
        assert report.trtllm is not None
        t = report.trtllm
        trtllm = TrtllmRecord(
            version=t["version"],
            installed=t["installed"],
            release=t["release"],
            backend=t["backend"],
            tensorrt_version=detect_tensorrt_version(),
        )
        files.update(trtllm_files(inputs, limits, gate, relaxed_options(req)))
        if req.mtp_relaxed_acceptance is not None:
            notes.append(
                "MTP relaxed acceptance is on (use_relaxed_acceptance_for_thinking, relaxed_topk "
                f"{req.mtp_relaxed_acceptance[0]}, relaxed_delta {req.mtp_relaxed_acceptance[1]:g}"
                "): lossy, during thinking drafts the target did not pick are accepted, so "
                "outputs are no longer the target's own"
            )
        spec_name, base_name = CONFIG_FILES["trtllm"]
        common = {
            "release": t["release"],
            "backend": t["backend"],
            "target_model": target_model,
            "build_dir": out,
            "tp": req.tp,
        }
        layout_flags = () if req.plain_tp else tuple(req.layout().serve_flags())
        common["layout_flags"] = layout_flags
        serve = launch.trtllm_server_argv(config_name=spec_name, speculative=True, **common)
        serve_base = launch.trtllm_server_argv(config_name=base_name, speculative=False, **common)
        if layout_flags:
            parallel = _parallel_record(inputs, serve, files)
        if t["backend"] == "tensorrt":
            steps, runnable, step_notes = engine_steps(
                report, out=out, limits=limits, tp=req.tp, examples=req.trtllm_examples
            )
            notes += step_notes
    else:
        speculative, baseline = torch_engine_configs(report, limits, gate)
        spec_name, base_name = CONFIG_FILES["torch"]
        files[spec_name] = json_bytes(speculative)
        files[base_name] = json_bytes(baseline)
        prefix = launch.SPECTOOL_ARGV
        serve = launch.torch_server_argv(
            prefix, target_model, drafter_model, report.method, out / spec_name
        )
        serve_base = launch.torch_server_argv(prefix, target_model, None, "none", out / base_name)
    if inputs.gpu.spec is not None and inputs.gpu.detected:
        here = inputs.gpu.detected[0]
        if here.spec is None or here.spec.name != inputs.gpu.spec.name:
            warnings.append(
                f"building for {inputs.gpu.spec.name} while this machine has {here.name}"
            )
    if inputs.decision is not None:
        if inputs.decision_bytes is not None:
            files[DECISION_NAME] = inputs.decision_bytes
        engine_word = {"tensorrt-llm": "trtllm", "trtllm": "trtllm", "torch": "torch"}
        measured = engine_word.get(inputs.decision.engine.lower(), inputs.decision.engine)
        if measured != req.engine:
            notes.append(
                f"the decision was measured on engine {inputs.decision.engine!r}, the build is "
                f"for {req.engine}: its numbers may not carry over"
            )
        if not inputs.decision.speculates_anywhere:
            notes.append(
                "the decision found no concurrency where speculation pays; spectool serve's cost "
                "gate serves the baseline"
            )
    manifest = Manifest(
        spectool_version=__version__,
        engine=req.engine,  # type: ignore[arg-type]
        method=report.method,
        max_draft_len=report.max_draft_len,
        tp=req.tp,
        target=_record(report.target, target_model),
        drafter=_record(report.drafter, drafter_model) if drafter_model is not None else None,
        gpu=_gpu_record(inputs.gpu),
        trtllm=trtllm,
        limits=limits,
        runtime_gate=gate.record,
        files={name: sha256_hex(data) for name, data in files.items()},
        decision=_decision_record(inputs),
        engine_build=(
            EngineBuildRecord(
                engine_dir=launch.ENGINE_DIR,
                baseline_engine_dir=launch.BASELINE_ENGINE_DIR,
                steps=steps,
                runnable=runnable,
            )
            if steps
            else None
        ),
        notes=tuple(notes),
        commands=CommandsRecord(
            build=build_argv(inputs, out), serve=tuple(serve), serve_baseline=tuple(serve_base)
        ),
        parallel=parallel,
    )
    return BuildPlan(out, files, manifest, tuple(notes), steps, runnable, tuple(warnings))


def _parallel_record(
    inputs: BuildInputs, serve: list[str], files: dict[str, bytes]
) -> ParallelRecord:
    """The layout, its memory per rank, and its launch files (added to ``files``)."""
    from spectool.deploy.launch_files import launch_files

    req, report = inputs.request, inputs.report
    layout = req.layout()
    title = f"{report.method} k={report.max_draft_len}, {Path(serve[1]).name} on TensorRT-LLM"
    written = launch_files(serve, layout, title=title)
    files.update(written)
    memory = report.memory
    return ParallelRecord(
        tp=layout.tp,
        pp=layout.pp,
        ep=layout.ep,
        attention_dp=layout.attention_dp,
        nodes=layout.nodes,
        gpus_per_node=layout.gpus_per_node,
        world_size=layout.world_size,
        serve_flags=tuple(layout.serve_flags()),
        per_rank=memory.per_rank if memory is not None else (),
        launch_files=tuple(written),
    )


def _model_refs(report: CheckReport) -> tuple[str, str | None]:
    """What the engine is given for the target and drafter (the profile's repo ids when the
    headers were not read)."""
    if report.target is None:
        return report.extra["target_ref"], report.extra.get("drafter_ref")
    drafter = model_ref(report.drafter) if report.drafter is not None else None
    return model_ref(report.target), drafter


def _record(ckpt: Checkpoint | None, ref: str) -> CheckpointRecord:
    """The manifest's record of a checkpoint; one never read is recorded by ref alone."""
    if ckpt is None:
        return CheckpointRecord(
            ref=ref, path=None, revision=None, architecture=None, kind="unread", config_sha256=None
        )
    return checkpoint_record(ckpt, ref)
