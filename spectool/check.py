"""``spectool check`` as a library call: references in, a :class:`CheckReport` out.

Data flow: profile expansion -> checkpoint inspection (headers only) -> method resolution ->
checkpoint rules (:mod:`spectool.compat`) -> engine rules (TensorRT-LLM release table or the
embedded engine) -> memory estimate for the GPU -> verdict. ``build`` and ``serve`` reuse it.
"""

from __future__ import annotations

from typing import Any

from spectool import methods
from spectool.check_request import (  # re-exported: spectool.check is where callers look
    DEFAULT_MAX_SEQ_LEN,
    DEFAULT_PROFILE,
    DEFAULT_TRTLLM_RELEASE,
    ENGINES,
    SELF_DRAFTER,
    TORCH_ENGINE_ARCHITECTURES,
    TORCH_ENGINE_METHODS,
    CheckReport,
    CheckRequest,
    PairOptions,
)
from spectool.check_rules import resolve_gpu as _resolve_gpu
from spectool.check_rules import trtllm_rules as _trtllm_rules
from spectool.check_rules import will_it_pay
from spectool.ckpt.inspect import Checkpoint
from spectool.ckpt.refs import resolve_checkpoint
from spectool.compat import check_pair, resolve_method
from spectool.errors import BadInputError
from spectool.findings import Finding, Severity, error, info, sort_findings
from spectool.inputs import check_pair_options
from spectool.memory import GIB, estimate_memory, memory_findings
from spectool.parallel import validate_for_checkpoint

__all__ = [
    "DEFAULT_MAX_SEQ_LEN",
    "DEFAULT_PROFILE",
    "DEFAULT_TRTLLM_RELEASE",
    "ENGINES",
    "SELF_DRAFTER",
    "TORCH_ENGINE_ARCHITECTURES",
    "TORCH_ENGINE_METHODS",
    "CheckReport",
    "CheckRequest",
    "PairOptions",
    "expand_profile",
    "run_check",
    "will_it_pay",
]


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
        from spectool.check_offline import profile_only_ok, profile_only_report

        if not profile_only_ok(req, recipe, target_ref, drafter_ref):
            raise
        return profile_only_report(req, recipe, profile, exc, (target_ref, drafter_ref))
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
        native = methods.get(method).uses_native_layers
        trtllm, engine_findings = _trtllm_rules(
            req,
            method,
            target.architecture,
            "mtp" if native else (drafter.kind if drafter else None),
            gpu_spec,
        )
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
