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

Limits (PyTorch backend), from the memory estimate of the check
(:mod:`spectool.memory`, per GPU after TP, at ``max_seq_len``):

* ``max_batch_size`` = sequences that fit with the drafter, capped by ``--max-batch-size``
  (default cap :data:`DEFAULT_MAX_BATCH_CAP`, TensorRT-LLM's own default);
* ``max_num_tokens`` = max(8192, ``max_seq_len``, ``max_batch_size * (k + 1)``): a whole prompt
  fits one step, and so does a full batch of verify steps;
* ``cuda_graph_config.batch_sizes`` = powers of two up to min(``max_batch_size``, 128), that
  bound itself, and every concurrency of the decision (its schedule keys are added by the YAML
  renderer), so every draft-length switch lands on a captured graph;
* ``kv_cache_config.free_gpu_memory_fraction``: the KV cache takes this share of the memory free
  after loading, and CUDA graphs are captured from what is left, so the fraction leaves room for
  ``200 MB`` per graph plus :data:`KV_HEADROOM_BYTES`; at most 0.9 (TensorRT-LLM's default).

From a decision, the choices per concurrency become the engine's runtime gate, in the form the
release supports: ``max_concurrency`` when the choices are one ``k`` then off, else
``draft_len_schedule``; a release with only ``max_concurrency`` gets the cut-off at the last
concurrency that speculates; a release with neither gets no gate (``serve``'s cost gate picks
the baseline when load is high). Each approximation is a note in the manifest.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spectool import __version__
from spectool.check import CheckReport, PairOptions, run_check
from spectool.ckpt.inspect import Checkpoint
from spectool.deploy import launch
from spectool.deploy.decision import Decision, read_decision
from spectool.deploy.machine import detect_tensorrt_version
from spectool.deploy.manifest import (
    CONFIG_FILES,
    DECISION_NAME,
    MANIFEST_NAME,
    CheckpointRecord,
    CommandsRecord,
    DecisionRecord,
    EngineBuildRecord,
    EngineStep,
    GpuRecord,
    LimitsRecord,
    Manifest,
    RuntimeGateRecord,
    TrtllmRecord,
    checkpoint_record,
    model_ref,
    reproducible_ref,
    sha256_hex,
)
from spectool.errors import BadInputError, EngineMissingError, OutputExistsError
from spectool.gpu import DetectedGpu
from spectool.io import atomic_write_bytes
from spectool.memory import (
    CUDA_GRAPH_BYTES,
    DEFAULT_GRAPH_BATCH_SIZES,
    GIB,
    KV_CACHE_FRACTION,
    MemoryEstimate,
)
from spectool.profiles import GpuSpec
from spectool.trtllm.engine_build import CKPT_TMP, engine_steps

ENGINES = ("trtllm", "torch")
DEFAULT_MAX_BATCH_CAP = 2048  # TensorRT-LLM's LlmArgs default max_batch_size
DEFAULT_MAX_NUM_TOKENS = 8192  # TensorRT-LLM's default; the memory estimate assumes it
CUDA_GRAPH_CAP = 128  # TensorRT-LLM's default largest CUDA-graph batch
KV_HEADROOM_BYTES = GIB // 2  # left free besides CUDA graphs (allocator slack, sampling buffers)
MIN_KV_FRACTION = 0.05
# The embedded engine's defaults (spectool serve --engine torch uses the same).
TORCH_DEFAULT_MAX_BATCH_SIZE = 32
TORCH_DEFAULT_MAX_SEQ_LEN = 1024


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
    if decision is not None and decision.method and decision.method != report.method:
        raise BadInputError(
            req.decision,
            f"the decision measured method {decision.method}, this build is {report.method}",
        )
    return BuildInputs(req, report, gpu, decision, decision_bytes)


# ---- step 2: plan ------------------------------------------------------------------------------


def kv_cache_fraction(memory: MemoryEstimate, graph_count: int) -> float:
    """Share of the memory free after loading to give the KV cache (module docstring), 2 dp."""
    free = memory.gpu_memory_bytes - memory.target_weight_bytes - memory.drafter_weight_bytes
    # The estimate's reserve holds context, activations and its default graph count; keep the
    # first two and count this build's graphs instead.
    free -= memory.reserve_bytes - DEFAULT_GRAPH_BATCH_SIZES * CUDA_GRAPH_BYTES
    if free <= 0:
        return MIN_KV_FRACTION
    keep = graph_count * CUDA_GRAPH_BYTES + KV_HEADROOM_BYTES
    fraction = min(KV_CACHE_FRACTION, 1.0 - keep / free)
    return max(MIN_KV_FRACTION, int(fraction * 100) / 100)


def _graph_sizes(max_batch_size: int, decision: Decision | None) -> tuple[int, ...]:
    cap = min(max_batch_size, CUDA_GRAPH_CAP)
    sizes = {1 << i for i in range(cap.bit_length()) if 1 << i <= cap} | {cap}
    if decision is not None:
        sizes |= {c for c in decision.concurrencies if c <= max_batch_size}
    return tuple(sorted(sizes))


def _limits(inputs: BuildInputs) -> LimitsRecord:
    req, report = inputs.request, inputs.report
    memory = report.memory
    if req.engine == "torch":
        cap = req.max_batch_size or TORCH_DEFAULT_MAX_BATCH_SIZE
        fit = memory.sequences_with_drafter if memory is not None else cap
        max_seq_len = memory.max_seq_len if memory is not None else req.max_seq_len
        max_seq_len = max_seq_len or TORCH_DEFAULT_MAX_SEQ_LEN
        limit = report.target.max_position_embeddings
        if limit:
            max_seq_len = min(max_seq_len, limit)
        return LimitsRecord(max_batch_size=max(1, min(cap, fit)), max_seq_len=max_seq_len)
    assert memory is not None, "TensorRT-LLM builds always have a GPU"
    batch = max(1, min(memory.sequences_with_drafter, req.max_batch_size or DEFAULT_MAX_BATCH_CAP))
    tokens = max(DEFAULT_MAX_NUM_TOKENS, memory.max_seq_len, batch * (report.max_draft_len + 1))
    if req.trtllm_backend == "tensorrt":  # engine limits are build_config; no CUDA-graph keys
        return LimitsRecord(
            max_batch_size=batch, max_seq_len=memory.max_seq_len, max_num_tokens=tokens
        )
    sizes = _graph_sizes(batch, inputs.decision)
    return LimitsRecord(
        max_batch_size=batch,
        max_seq_len=memory.max_seq_len,
        max_num_tokens=tokens,
        free_gpu_memory_fraction=kv_cache_fraction(memory, len(sizes) + 1),
        cuda_graph_batch_sizes=sizes,
        cuda_graph_padding=True,
    )


@dataclass(frozen=True)
class _Gate:
    """The runtime gate chosen for the speculative config: engine keyword arguments + record."""

    kwargs: dict[str, Any]
    record: RuntimeGateRecord | None
    notes: tuple[str, ...]


def _runtime_gate(inputs: BuildInputs, limits: LimitsRecord) -> _Gate:
    decision = inputs.decision
    if decision is None or not decision.speculates_anywhere:
        return _Gate({}, None, ())
    off_above = decision.off_above
    assert off_above is not None
    if off_above >= limits.max_batch_size:
        return _Gate({}, None, ())  # the server never batches beyond where speculation pays
    gate = decision.gate()
    if inputs.request.engine == "torch":
        if gate is not None:
            return _Gate(
                {"max_concurrency": gate.max_concurrency}, _record("max_concurrency", off_above), ()
            )
        schedule = decision.draft_len_schedule("up_to")
        return _Gate({"draft_len_schedule": schedule}, _record("draft_len_schedule", off_above), ())
    from spectool.trtllm.releases import release_info

    assert inputs.report.trtllm is not None
    release = inputs.report.trtllm["release"]
    rel = f"TensorRT-LLM {release}"
    if inputs.request.trtllm_backend != "pytorch":
        return _Gate(
            {},
            None,
            (
                f"{rel}'s TensorRT backend cannot switch speculation off by batch size; "
                "spectool serve's cost gate picks the baseline under load",
            ),
        )
    info = release_info(release)
    base, notes = _path_kwargs(inputs, release, off_above)
    if base is None:
        return _Gate({}, None, notes)
    path = "two_model" if base.get("two_model") else "one_model"
    if gate is not None and info.has_max_concurrency:
        return _Gate(
            {**base, "max_concurrency": gate.max_concurrency},
            _record("max_concurrency", off_above, path),
            notes,
        )
    if info.has_draft_len_schedule:
        schedule = decision.draft_len_schedule("from")
        return _Gate(
            {**base, "draft_len_schedule": schedule},
            _record("draft_len_schedule", off_above, path),
            notes,
        )
    if info.has_max_concurrency:
        return _Gate(
            {**base, "max_concurrency": off_above},
            _record("max_concurrency", off_above, path),
            (
                *notes,
                f"{rel} has no draft_len_schedule: the decision's per-concurrency draft lengths "
                f"became max_draft_len {decision.max_draft_len} up to concurrency {off_above}, then off",
            ),
        )
    return _Gate(
        {},
        None,
        (
            f"{rel} cannot switch speculation off by batch size (no draft_len_schedule or "
            f"max_concurrency); speculative.yaml always speculates and spectool serve's cost gate "
            f"picks baseline.yaml above concurrency {off_above}",
        ),
    )


def _record(kind: str, off_above: int, path: str | None = None) -> RuntimeGateRecord:
    return RuntimeGateRecord(kind=kind, off_above=off_above, drafter_path=path)  # type: ignore[arg-type]


INERT_GATE_CHOICES = ("serve", "two-model")


def _path_kwargs(
    inputs: BuildInputs, release: str, off_above: int
) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """Renderer arguments for a drafter path that honours the gate, or None and the reason.

    Consults the gate table (:mod:`spectool.trtllm.gates`). Where the method's default path
    ignores the gate, ``--inert-gate`` chooses, and the note says which and why.
    """
    from spectool.trtllm.gates import gate_support, two_model_key
    from spectool.trtllm.releases import release_info

    report, choice = inputs.report, inputs.request.inert_gate
    if choice not in INERT_GATE_CHOICES:
        raise BadInputError(
            "--inert-gate", f"expected one of {', '.join(INERT_GATE_CHOICES)}, got {choice!r}"
        )
    mtp_layers = report.target.mtp_layers if report.method == "mtp" else None
    support = gate_support(release, report.method, mtp_layers=mtp_layers)
    kwargs: dict[str, Any] = {"mtp_layers": mtp_layers} if mtp_layers else {}
    info = release_info(release)
    if support.effective or not (info.has_max_concurrency or info.has_draft_len_schedule):
        if not support.effective:
            return None, (
                f"TensorRT-LLM {release} cannot switch speculation off by batch size (no "
                f"draft_len_schedule or max_concurrency); speculative.yaml always speculates and "
                f"spectool serve's cost gate picks baseline.yaml above concurrency {off_above}",
            )
        return kwargs, ()
    key = two_model_key(release, report.method)
    if choice == "two-model" and key is not None:
        return {**kwargs, "two_model": True}, (
            f"{support.describe()}; chose the two-model path ({key}: false) so the runtime "
            f"gate takes effect: two-model has a different step cost from the one-model path, "
            "so measure it (spectool tune) before relying on the decision",
        )
    alternative = (
        f"; --inert-gate two-model would write {key}: false instead (a different step cost, to "
        "be measured)"
        if key is not None
        else ""
    )
    return None, (
        f"{support.describe()}; chose no runtime gate: speculative.yaml always speculates and "
        f"spectool serve's cost gate picks baseline.yaml above concurrency {off_above}"
        f"{alternative}",
    )


# PyTorch releases that load the draft model from a local folder only: PR #10099 ("Auto download
# speculative models from HF for pytorch backend", merged 2025-12-18) says "for the PyTorch /
# AutoDeploy backends, the draft model for speculative decoding needs to be provided as a local
# path"; it shipped with 1.2 (speculative_model with alias speculative_model_dir, v1.2.json).
LOCAL_DRAFTER_RELEASES = frozenset({"0.21", "1.0", "1.1"})


def _local_drafter(ref: str, drafter: Checkpoint, release: str, req: BuildRequest) -> str:
    """A local folder for a hub drafter on releases that cannot download it themselves."""
    if Path(ref).expanduser().is_dir():
        return ref
    if not req.download:
        raise BadInputError(
            "drafter",
            f"TensorRT-LLM {release}'s PyTorch backend needs a local draft model folder, not the "
            f"repo id {ref}; pass --download, or run `huggingface-cli download {ref} --local-dir "
            f"DIR` and give DIR as the drafter",
        )
    from huggingface_hub import snapshot_download

    try:
        return str(snapshot_download(ref, revision=drafter.revision or None))
    except Exception as exc:  # network, auth, missing repo: one line, exit 2
        raise BadInputError("drafter", f"cannot download {ref}: {exc}") from None


def _validated_yaml(text: str, release: str, backend: str) -> bytes:
    """Re-read the rendered YAML as TensorRT-LLM will and validate it for the release."""
    from spectool.trtllm.validate import validate_options

    validate_options(yaml.safe_load(text), release, backend)
    return text.encode("utf-8")


def _trtllm_files(inputs: BuildInputs, limits: LimitsRecord, gate: _Gate) -> dict[str, bytes]:
    from spectool.trtllm.releases import release_info
    from spectool.trtllm.spec_yaml import ServeLimits, render_baseline_yaml, render_speculative_yaml

    report = inputs.report
    assert report.trtllm is not None
    release, backend = report.trtllm["release"], report.trtllm["backend"]
    serve_limits = ServeLimits(
        free_gpu_memory_fraction=limits.free_gpu_memory_fraction,
        max_batch_size=limits.max_batch_size,
        max_num_tokens=limits.max_num_tokens,
        cuda_graph_batch_sizes=limits.cuda_graph_batch_sizes,
    )
    spec = release_info(release).method(report.method, backend)
    drafter_ref = None
    if report.drafter is not None and spec is not None and spec.drafter_key is not None:
        drafter_ref = model_ref(report.drafter)
        if backend == "pytorch" and release in LOCAL_DRAFTER_RELEASES:
            drafter_ref = _local_drafter(drafter_ref, report.drafter, release, inputs.request)
    extra = {"max_seq_len": limits.max_seq_len}
    speculative = render_speculative_yaml(
        report.method,
        release,
        backend,
        drafter_ref=drafter_ref,
        max_draft_len=report.max_draft_len,
        limits=serve_limits,
        extra=extra,
        **gate.kwargs,
    )
    baseline = render_baseline_yaml(release, backend, limits=serve_limits, extra=extra)
    names = CONFIG_FILES["trtllm"]
    return {
        names[0]: _validated_yaml(speculative, release, backend),
        names[1]: _validated_yaml(baseline, release, backend),
    }


def torch_engine_configs(
    report: CheckReport, limits: LimitsRecord, gate: _Gate
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(speculative, baseline) EngineConfig fields for the embedded engine, validated."""
    from spectool.deploy.engine_config import validate_engine_config

    common = {"max_batch_size": limits.max_batch_size, "max_seq_len": limits.max_seq_len}
    schedule = gate.kwargs.get("draft_len_schedule")
    speculative: dict[str, Any] = {"method": report.method, "max_draft_len": report.max_draft_len}
    # only the gate that applies (no ``null`` beside a limit): a schedule, a cut-off, or neither
    if schedule:
        speculative["draft_len_schedule"] = {str(b): k for b, k in schedule.items()}
    if gate.kwargs.get("max_concurrency") is not None:
        speculative["max_concurrency"] = gate.kwargs["max_concurrency"]
    speculative.update(common)
    baseline = {"method": "none", **common}  # no draft length: it does not speculate
    for config in (speculative, baseline):
        validate_engine_config(config)  # ConfigError for anything the engine would refuse
    return speculative, baseline


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode("utf-8")


def build_argv(inputs: BuildInputs, out: Path) -> tuple[str, ...]:
    """The ``spectool build`` command line that reproduces this build (resolved values)."""
    req, report = inputs.request, inputs.report
    argv = ["spectool", "build", reproducible_ref(report.target)]
    if report.drafter is not None:
        argv.append(reproducible_ref(report.drafter))
    elif report.method == "mtp":
        argv.append("self")
    argv += ["--engine", req.engine, "--method", report.method]
    argv += ["--max-draft-len", str(report.max_draft_len), "--out", str(out)]
    if req.engine == "trtllm":
        assert report.trtllm is not None
        version = report.trtllm["version"] or report.trtllm["release"]
        argv += ["--trtllm-version", str(version), "--trtllm-backend", req.trtllm_backend]
    if inputs.gpu.spec is not None:
        argv += ["--gpu", inputs.gpu.spec.name]
    argv += ["--tp", str(req.tp)]
    if req.max_batch_size is not None:
        argv += ["--max-batch-size", str(req.max_batch_size)]
    if req.max_seq_len is not None:
        argv += ["--max-seq-len", str(req.max_seq_len)]
    if req.decision is not None:
        argv += ["--decision", str(Path(req.decision).resolve())]
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
    limits = _limits(inputs)
    gate = _runtime_gate(inputs, limits)
    notes = list(gate.notes)
    warnings: list[str] = []
    target_model = model_ref(report.target)
    drafter_model = model_ref(report.drafter) if report.drafter is not None else None
    files: dict[str, bytes] = {}
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
        files.update(_trtllm_files(inputs, limits, gate))
        spec_name, base_name = CONFIG_FILES["trtllm"]
        common = {
            "release": t["release"],
            "backend": t["backend"],
            "target_model": target_model,
            "build_dir": out,
            "tp": req.tp,
        }
        serve = launch.trtllm_server_argv(config_name=spec_name, speculative=True, **common)
        serve_base = launch.trtllm_server_argv(config_name=base_name, speculative=False, **common)
        if t["backend"] == "tensorrt":
            steps, runnable, step_notes = engine_steps(
                report, out=out, limits=limits, tp=req.tp, examples=req.trtllm_examples
            )
            notes += step_notes
    else:
        speculative, baseline = torch_engine_configs(report, limits, gate)
        spec_name, base_name = CONFIG_FILES["torch"]
        files[spec_name] = _json_bytes(speculative)
        files[base_name] = _json_bytes(baseline)
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
        target=checkpoint_record(report.target, target_model),
        drafter=_drafter_record(report.drafter, drafter_model),
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
    )
    return BuildPlan(out, files, manifest, tuple(notes), steps, runnable, tuple(warnings))


def _drafter_record(ckpt: Checkpoint | None, ref: str | None) -> CheckpointRecord | None:
    return checkpoint_record(ckpt, ref) if ckpt is not None and ref is not None else None


# ---- step 3: write -----------------------------------------------------------------------------


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
