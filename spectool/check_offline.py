"""``spectool check`` without the checkpoints' headers (offline, not cached): from a profile.

When the headers cannot be read and the models are a profile's own, with a GPU named, check goes
on from the profile's ``geometry`` block: memory per rank (:mod:`spectool.memory_geometry`), the
release's rules for the method, backend, GPU and layout (not the architecture's: unknown), and
the prediction. The verdict is ``unverified``; ``build`` writes a build from it (its manifest
says the checkpoints were not read).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from spectool import methods
from spectool.check_request import DEFAULT_MAX_SEQ_LEN, SELF_DRAFTER, CheckReport, CheckRequest
from spectool.check_rules import resolve_gpu as _resolve_gpu
from spectool.check_rules import trtllm_rules as _trtllm_rules
from spectool.check_rules import will_it_pay
from spectool.errors import BadInputError
from spectool.findings import Severity, sort_findings
from spectool.memory import GIB, MemoryEstimate, memory_findings


def profile_only_ok(
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
    "engine support rules for the architecture",
    "memory estimate",
)


def profile_only_report(
    req: CheckRequest,
    recipe: Any,
    profile: str | None,
    exc: BadInputError,
    refs: tuple[str, str | None],
) -> CheckReport:
    """Headers unavailable (offline, not cached): memory per rank and the prediction from the
    profile's geometry, the release's rules for the method and layout (not the architecture's),
    and a finding naming every check that did not run. Verdict ``unverified``. ``extra`` holds
    the models' references and the target's MTP layers, for ``build``."""
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
    memory = _geometry_memory(req, recipe, profile, method, max_draft_len, gpu_spec)
    not_run = [n for n in NOT_RUN_WITHOUT_HEADERS if memory is None or n != "memory estimate"]
    from_geometry = (
        f"; memory per rank from the profile's geometry at max_seq_len {memory.max_seq_len}"
        + ("" if req.max_seq_len else " (spectool's default: the model's context is not read)")
        if memory is not None
        else ""
    )
    finding = warning(
        "HEADERS_UNAVAILABLE",
        f"not run: {', '.join(not_run)}: {reason}{from_geometry}",
        "Run once online (or pass local folders) for the compatibility verdict; the prediction "
        "uses the profile's geometry block.",
    )
    findings = [finding]
    if memory is not None:
        findings += memory_findings(memory, req.max_batch_size)
    trtllm = None
    if req.engine == "trtllm":
        native = methods.get(method).uses_native_layers
        trtllm, engine_findings = _trtllm_rules(
            req, method, None, "mtp" if native else None, gpu_spec
        )
        findings += engine_findings
    pays: dict[str, Any] = {"predicted": True, "skipped": "the check found errors; fix those first"}
    if not any(f.severity is Severity.ERROR for f in findings):
        pays = will_it_pay(req, method, max_draft_len, None, None, recipe, profile, gpu_spec)
    return CheckReport(
        method=method,
        engine=req.engine,
        max_draft_len=max_draft_len,
        target=None,
        drafter=None,
        findings=sort_findings(findings),
        memory=memory,
        trtllm=trtllm,
        gpu={"name": gpu_spec.name, "sm": gpu_spec.sm, "memory_gib": gpu_spec.memory_gib},
        profile=profile,
        extra={
            "target_ref": refs[0],
            "drafter_ref": refs[1] if refs[1] != SELF_DRAFTER else None,
            "mtp_layers": recipe.geometry.target.mtp_layers,
        },
        pays=pays,
        unread=reason,
    )


def _geometry_memory(
    req: CheckRequest, recipe: Any, profile: str | None, method: str, k: int, gpu_spec: Any
) -> MemoryEstimate | None:
    """Memory per rank from the profile's geometry (:mod:`spectool.memory_geometry`) on the
    TensorRT-LLM engine; None for the embedded engine (it runs the profile's own checkpoints)."""
    if req.engine != "trtllm":
        return None
    from spectool import predicted
    from spectool.memory_geometry import rank_memory_from_geometry

    geom = predicted.pair_geometry(None, None, method, recipe, profile)
    memory = rank_memory_from_geometry(
        geom.target,
        geom.drafter,
        method,
        req.layout(),
        where=f"profile {profile}",
        gpu_name=gpu_spec.name,
        gpu_memory_bytes=int(gpu_spec.memory_gib * GIB),
        max_seq_len=req.max_seq_len or DEFAULT_MAX_SEQ_LEN,
        max_draft_len=k,
    )
    if req.plain_tp:  # one table row is the estimate itself, as with headers
        return dataclasses.replace(memory, layout=None, per_rank=())
    return memory
