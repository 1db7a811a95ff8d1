"""``spectool check`` as a library call: references in, a :class:`CheckReport` out.

Data flow: profile expansion -> checkpoint inspection (headers only) -> method resolution ->
checkpoint rules (:mod:`spectool.compat`) -> engine rules (TensorRT-LLM release table or the
embedded engine) -> memory estimate for the GPU -> verdict. ``build`` and ``serve`` reuse it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from spectool import methods
from spectool.ckpt.inspect import Checkpoint
from spectool.ckpt.refs import resolve_checkpoint
from spectool.compat import check_pair, resolve_method
from spectool.errors import BadInputError
from spectool.findings import Finding, Severity, error, info, sort_findings
from spectool.inputs import check_pair_options
from spectool.memory import GIB, MemoryEstimate, estimate_memory, memory_findings
from spectool.parallel import ParallelLayout, layout_from_flags, validate_for_checkpoint

ENGINES = ("trtllm", "torch", "none")
DEFAULT_PROFILE = "demo"
SELF_DRAFTER = methods.SELF_DRAFTER
# What spectool's embedded engine runs (spectool.methods: engines containing "torch").
TORCH_ENGINE_METHODS = methods.engine_methods("torch")
TORCH_ENGINE_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
DEFAULT_MAX_SEQ_LEN = 8192
# Judged against when TensorRT-LLM is not installed and no --trtllm-version is given: the newest
# release on PyPI (1.2.1) at the time of writing.
DEFAULT_TRTLLM_RELEASE = "1.2"


@dataclass(frozen=True)
class PairOptions:
    """What ``check``, ``build`` and ``tune`` are all asked: the pair, the method and the
    deployment it is judged for. :class:`CheckRequest` adds the engine; ``build``'s and
    ``tune``'s requests extend this and turn it into one CheckRequest with
    :meth:`check_request`."""

    target: str | None = None
    drafter: str | None = None
    profile: str | None = None
    method: str = "auto"
    max_draft_len: int | None = None
    trtllm_version: str | None = None
    trtllm_backend: str = "pytorch"
    gpu: str | None = "auto"
    tp: int = 1
    max_batch_size: int | None = None
    max_seq_len: int | None = None
    trust_remote_code: bool = False
    # The rest of the parallel layout (spectool.parallel); tp above is its tensor-parallel size.
    pp: int = 1
    ep: int = 1
    attention_dp: bool = False
    nodes: int = 1
    gpus_per_node: int | None = None

    def layout(self) -> ParallelLayout:
        """The parallel layout asked for (:func:`spectool.parallel.layout_from_flags`)."""
        return layout_from_flags(
            tp=self.tp,
            pp=self.pp,
            ep=self.ep,
            attention_dp=self.attention_dp,
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
        )

    @property
    def plain_tp(self) -> bool:
        """Only --tp (one node, no PP/EP/attention DP): the single-table memory estimate."""
        return (
            self.pp == 1
            and self.ep == 1
            and not self.attention_dp
            and self.nodes == 1
            and self.gpus_per_node in (None, self.tp)
        )

    def pair_options(self, **changes: Any) -> dict[str, Any]:
        """These options as keyword arguments (``changes`` replace some)."""
        return {**{f.name: getattr(self, f.name) for f in fields(PairOptions)}, **changes}

    def check_request(self, engine: str, **changes: Any) -> CheckRequest:
        """The :class:`CheckRequest` for ``engine`` (``changes`` replace some options)."""
        return CheckRequest(engine=engine, **self.pair_options(**changes))


@dataclass(frozen=True)
class CheckRequest(PairOptions):
    engine: str = "trtllm"
    # The "will it pay" section (spectool.predicted): asked for when a GPU is known.
    concurrency: tuple[int, ...] | None = None
    acceptance_length: float | None = None
    acceptance_rate: float | None = None


@dataclass(frozen=True)
class CheckReport:
    method: str
    engine: str
    max_draft_len: int
    target: Checkpoint | None  # None: headers unavailable (offline), see ``unread``
    drafter: Checkpoint | None
    findings: list[Finding]
    memory: MemoryEstimate | None
    trtllm: dict[str, Any] | None = None
    gpu: dict[str, Any] | None = None
    profile: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    pays: dict[str, Any] | None = None  # the prediction (spectool.predicted.pays_json)
    unread: str | None = None  # why the headers could not be read; checks that did not run

    @property
    def verdict(self) -> str:
        if self.errors:
            return "incompatible"
        return "unverified" if self.unread else "compatible"

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "method": self.method,
            "engine": self.engine,
            "max_draft_len": self.max_draft_len,
            "profile": self.profile,
            "target": self.target.summary() if self.target else None,
            "drafter": self.drafter.summary() if self.drafter else None,
            "findings": [f.to_json() for f in self.findings],
            "memory": self.memory.to_json() if self.memory else None,
            "trtllm": self.trtllm,
            "gpu": self.gpu,
            "unverified": self.unread,
            "will_it_pay": self.pays,
        }


def expand_profile(req: CheckRequest) -> tuple[str, str | None, str, int | None, str | None]:
    """(target ref, drafter ref, method, max_draft_len, profile name) after profile expansion.

    A profile may be named by ``--profile`` or stand in for TARGET; with no models at all the
    embedded ``demo`` pair is used. Explicit arguments override the profile's values.
    """
    from spectool import profiles

    name = req.profile
    target, drafter = req.target, req.drafter
    if (
        name is None
        and target is not None
        and profiles.is_profile_name(target)
        and not _is_path(target)
    ):
        name, target = target, None
    if name is None and target is None:
        name = DEFAULT_PROFILE
    method, max_draft_len = req.method, req.max_draft_len
    if name is not None:
        recipe = profiles.load_profile(name)
        target = target or recipe.target
        if drafter is None:
            drafter = recipe.drafter
        if method == "auto":
            method = recipe.method
        if max_draft_len is None:
            max_draft_len = recipe.max_draft_len
    if drafter is not None and profiles.is_profile_name(drafter) and not _is_path(drafter):
        drafter = profiles.load_profile(drafter).drafter
    if drafter == SELF_DRAFTER and method == "auto":
        method = "mtp"  # "self" names the target's own MTP layers: never a silent n-gram
    assert target is not None
    return target, drafter, method, max_draft_len, name


def _is_path(ref: str) -> bool:
    from pathlib import Path

    return Path(ref).expanduser().exists()


def run_check(req: CheckRequest) -> CheckReport:
    if req.engine not in ENGINES:
        raise BadInputError(
            "--engine", f"unknown engine {req.engine!r}; choose from {', '.join(ENGINES)}"
        )
    check_pair_options(req)  # bad input (exit 2) before anything is read
    layout = req.layout()
    target_ref, drafter_ref, method, max_draft_len, profile = expand_profile(req)
    recipe = _recipe(profile)
    try:
        target = resolve_checkpoint(target_ref)
        drafter = (
            resolve_checkpoint(drafter_ref) if drafter_ref and drafter_ref != SELF_DRAFTER else None
        )
    except BadInputError as exc:
        if not _profile_only_ok(req, recipe, target_ref, drafter_ref):
            raise
        return _profile_only_report(req, recipe, profile, exc)
    validate_for_checkpoint(layout, target)  # bad layout: exit 2 naming the flag
    method = resolve_method(method, target, drafter)
    if max_draft_len is None:
        native = methods.get(method).uses_native_layers
        max_draft_len = (target.mtp_layers or 1) if native else 4
    max_seq_len = req.max_seq_len or min(
        target.max_position_embeddings or DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_SEQ_LEN
    )
    findings = check_pair(
        target, drafter, method, max_draft_len=max_draft_len, max_seq_len=req.max_seq_len
    )
    findings += _remote_code_rule(target, drafter, req.trust_remote_code)

    gpu_spec = _resolve_gpu(req.gpu)
    trtllm: dict[str, Any] | None = None
    if req.engine == "trtllm":
        trtllm, engine_findings = _trtllm_rules(req, method, target, drafter, gpu_spec)
        findings += engine_findings
    elif req.engine == "torch":
        findings += _torch_engine_rules(method, target, drafter)

    memory = None
    gpu_json = None
    if gpu_spec is not None:
        gpu_json = {"name": gpu_spec.name, "sm": gpu_spec.sm, "memory_gib": gpu_spec.memory_gib}
        sizes = {
            "gpu_name": gpu_spec.name,
            "gpu_memory_bytes": int(gpu_spec.memory_gib * GIB),
            "max_seq_len": max_seq_len,
            "max_draft_len": max_draft_len,
        }
        if req.plain_tp:
            memory = estimate_memory(target, drafter, method, tp=req.tp, **sizes)
        else:
            from spectool.memory_ranks import rank_memory

            memory = rank_memory(target, drafter, method, layout, **sizes)
        findings += memory_findings(memory, req.max_batch_size)
    pays = None
    if gpu_spec is not None and any(f.severity is Severity.ERROR for f in findings):
        # the prediction depends on the pair; the errors above are the first thing to fix
        pays = {"predicted": True, "skipped": "the check found errors; fix those first"}
    elif gpu_spec is not None:
        pays = will_it_pay(req, method, max_draft_len, target, drafter, recipe, profile, gpu_spec)
    return CheckReport(
        method=method,
        engine=req.engine,
        max_draft_len=max_draft_len,
        target=target,
        drafter=drafter,
        findings=sort_findings(findings),
        memory=memory,
        trtllm=trtllm,
        gpu=gpu_json,
        profile=profile,
        pays=pays,
    )


def _recipe(profile: str | None) -> Any:
    from spectool import profiles

    return profiles.load_profile(profile) if profile else None


def _profile_only_ok(
    req: CheckRequest, recipe: Any, target_ref: str, drafter_ref: str | None
) -> bool:
    """Whether check may go on from the profile alone when headers cannot be read: a GPU was
    named (the prediction is what is left to say) and the models are the profile's own."""
    return (
        recipe is not None
        and recipe.geometry is not None
        and req.gpu not in (None, "auto")
        and target_ref == recipe.target
        and drafter_ref == recipe.drafter
    )


# What check could not do without the checkpoints' headers.
NOT_RUN_WITHOUT_HEADERS = (
    "checkpoint rules (architecture, vocabulary, drafter kind)",
    "engine support rules",
    "memory estimate",
)


def _profile_only_report(
    req: CheckRequest, recipe: Any, profile: str | None, exc: BadInputError
) -> CheckReport:
    """Headers unavailable (offline, not cached): the prediction from the profile's geometry,
    and a finding naming every check that did not run. Verdict ``unverified``."""
    from spectool.findings import warning
    from spectool.parallel import validate_layout

    geometry = recipe.geometry.target
    validate_layout(
        req.layout(),
        heads=geometry.num_attention_heads,
        layers=geometry.num_layers,
        experts=geometry.num_experts or None,
    )
    gpu_spec = _resolve_gpu(req.gpu)
    method = recipe.method if req.method == "auto" else req.method
    max_draft_len = req.max_draft_len or recipe.max_draft_len
    reason = " ".join(str(exc).split())
    finding = warning(
        "HEADERS_UNAVAILABLE",
        f"not run: {', '.join(NOT_RUN_WITHOUT_HEADERS)}: {reason}",
        "Run once online (or pass local folders) for the compatibility verdict; the prediction "
        "uses the profile's geometry block.",
    )
    pays = will_it_pay(req, method, max_draft_len, None, None, recipe, profile, gpu_spec)
    return CheckReport(
        method=method,
        engine=req.engine,
        max_draft_len=max_draft_len,
        target=None,
        drafter=None,
        findings=[finding],
        memory=None,
        gpu={"name": gpu_spec.name, "sm": gpu_spec.sm, "memory_gib": gpu_spec.memory_gib},
        profile=profile,
        pays=pays,
        unread=reason,
    )


def will_it_pay(
    req: CheckRequest,
    method: str,
    max_draft_len: int,
    target: Checkpoint | None,
    drafter: Checkpoint | None,
    recipe: Any,
    profile: str | None,
    gpu_spec: Any,
) -> dict[str, Any]:
    """The "will it pay" section: predicted speed-up per concurrency (with acceptance) or the
    break-even acceptance (without), on TensorRT-LLM's engine defaults for ``gpu_spec``."""
    from spectool import predicted
    from spectool.predict import Hardware, describe, predict, setup_for
    from spectool.predict.model import METHODS as PREDICTED_METHODS

    concurrency = req.concurrency or predicted.DEFAULT_CONCURRENCY
    if req.engine == "torch":
        return {
            "predicted": True,
            "skipped": "the embedded engine's calibration is a CPU probe: "
            "spectool tune --predict-only --engine torch",
        }
    if method not in PREDICTED_METHODS:
        return {"predicted": True, "skipped": f"no step-cost model for method {method}"}
    geom = predicted.pair_geometry(target, drafter, method, recipe, profile)
    flags = predicted.AcceptanceFlags(req.acceptance_length, req.acceptance_rate)
    acceptance = predicted.resolve_acceptance(flags, recipe, max_draft_len)
    setup = setup_for(
        geom.target,
        method,
        Hardware.from_gpu(gpu_spec),
        drafter=geom.drafter,
        mtp_layer=geom.mtp_layer,
        engine="trtllm",
        tp=req.tp,
        context=predicted.DEFAULT_CONTEXT,
    )
    # with an acceptance figure, the best k among those the deployment may use (beyond the
    # figure's own draft length a single rate only extrapolates); without, break-even up to 8
    ks = predicted.ks_for(max_draft_len) if acceptance is None else range(1, max_draft_len + 1)
    pred = predict(setup, acceptance, concurrency, tuple(ks))
    out = predicted.pays_json(pred, geom.source, "trtllm")
    out["lines"] = describe(pred)
    return out


def _resolve_gpu(arg: str | None) -> Any:
    from spectool.gpu import resolve_gpu

    return resolve_gpu(arg)


def _remote_code_rule(target: Checkpoint, drafter: Checkpoint | None, trust: bool) -> list[Finding]:
    needs = [
        c.ref
        for c in (target, drafter)
        if c is not None and isinstance(c.config.get("auto_map"), dict)
    ]
    if not needs or trust:
        return []
    return [
        info(
            "REMOTE_CODE",
            f"{', '.join(needs)} ship custom modelling code (auto_map); spectool read only metadata",
            "Serving engines may need --trust-remote-code; pass it only if you trust the repository.",
        )
    ]


def _torch_engine_rules(
    method: str, target: Checkpoint, drafter: Checkpoint | None
) -> list[Finding]:
    findings: list[Finding] = []
    if "torch" not in methods.get(method).engines:
        findings.append(
            error(
                "UNSUPPORTED_BY_ENGINE",
                f"spectool's embedded engine runs {', '.join(TORCH_ENGINE_METHODS)}, not {method}",
                f"Use --engine trtllm for this method, or {' / '.join(TORCH_ENGINE_METHODS)} on "
                "the embedded engine.",
            )
        )
    for role, ckpt in (
        ("target", target),
        ("drafter", drafter if "standalone_drafter" in methods.get(method).needs else None),
    ):
        if ckpt is not None and ckpt.architecture not in TORCH_ENGINE_ARCHITECTURES:
            findings.append(
                error(
                    "UNSUPPORTED_BY_ENGINE",
                    f"{role} architecture {ckpt.architecture} is not one the embedded engine runs "
                    f"({', '.join(TORCH_ENGINE_ARCHITECTURES)})",
                    "Use --engine trtllm for this model.",
                )
            )
    return findings


def _trtllm_rules(
    req: CheckRequest, method: str, target: Checkpoint, drafter: Checkpoint | None, gpu_spec: Any
) -> tuple[dict[str, Any], list[Finding]]:
    from spectool.trtllm import releases
    from spectool.trtllm.support import support_findings

    installed = releases.detect_installed_version()
    version = req.trtllm_version or installed
    release = releases.release_for_version(version) if version else DEFAULT_TRTLLM_RELEASE
    native = methods.get(method).uses_native_layers
    drafter_kind = "mtp" if native else (drafter.kind if drafter else None)
    findings = support_findings(
        method,
        target_architecture=target.architecture,
        drafter_kind=drafter_kind,
        backend=req.trtllm_backend,
        release=release,
        sm=gpu_spec.sm if gpu_spec is not None else None,
    )
    from spectool.parallel import release_layout_problem

    if req.trtllm_backend in releases.release_info(release).backends:
        problem = release_layout_problem(req.layout(), release, req.trtllm_backend)
        if problem is not None:
            findings.append(
                error(
                    "LAYOUT_UNSUPPORTED_BY_RELEASE",
                    problem,
                    "Use a TensorRT-LLM release whose LLM API has these options.",
                )
            )
    info_json = {
        "version": version,
        "installed": installed,
        "release": release,
        "backend": req.trtllm_backend,
    }
    return info_json, findings
