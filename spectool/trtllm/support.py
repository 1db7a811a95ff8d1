"""Whether TensorRT-LLM can run a speculative method at all, as findings for ``spectool check``.

This answers the TensorRT-LLM half of "is this pair usable": the method exists on the chosen
backend of the chosen release, the target architecture has the model code the method needs, and
the GPU's SM is high enough. The checkpoint half (shapes, vocabularies) is ``spectool.compat``'s.

Finding codes (stable, documented in the README):

* ``UNSUPPORTED_BY_TRTLLM`` (error): backend missing from the release, method missing from the
  backend, architecture without the needed model code (MTP, TensorRT EAGLE-1), drafter weights
  the backend cannot load, GPU SM below the requirement.
* ``EAGLE_ALIAS`` (warning): method ``eagle`` on the PyTorch backend, where TensorRT-LLM turns
  ``Eagle`` into ``Eagle3``; EAGLE-1/2 weights do not load there.
* ``TRTLLM_ARCH_UNLISTED`` (warning): an Eagle3 target the release notes never name (the one-model
  Eagle3 path is generic, so it may work).
* ``TRTLLM_SM_UNLISTED`` (warning): an SM at or above the minimum that the support matrix of the
  release does not list.
* ``TRTLLM_GATE_INERT`` (warning): the release parses ``max_concurrency`` /
  ``draft_len_schedule`` for the method but its default drafter path ignores them (the gate
  table, :mod:`spectool.trtllm.gates`), so speculation cannot be switched off under load by the
  engine itself.
* ``TRTLLM_ONE_MODEL_RESUME_BUG`` (warning): main's one-model dynamic draft length: after a
  drafter skipped drafting under load (draft length 0 above the schedule) and resumes,
  acceptance collapses; the fix, PR #16888 "Keep drafting alive when dynamic draft length hits
  its floor", is open (July 2026).
"""

from __future__ import annotations

from spectool.errors import ConfigError
from spectool.findings import Finding, error, warning
from spectool.trtllm.releases import (
    DRAFTER_KINDS,
    check_backend,
    check_method,
    release_info,
)

UNSUPPORTED = "UNSUPPORTED_BY_TRTLLM"
EAGLE_ALIAS = "EAGLE_ALIAS"
ARCH_UNLISTED = "TRTLLM_ARCH_UNLISTED"
SM_UNLISTED = "TRTLLM_SM_UNLISTED"
GATE_INERT = "TRTLLM_GATE_INERT"
RESUME_BUG = "TRTLLM_ONE_MODEL_RESUME_BUG"


def _sm_text(sm: int) -> str:
    return f"SM {sm // 10}.{sm % 10}" if sm >= 10 else f"SM {sm}"


def support_findings(
    method: str,
    *,
    target_architecture: str | None,
    drafter_kind: str | None,
    backend: str,
    release: str,
    sm: int | None,
) -> list[Finding]:
    """Findings on running ``method`` with TensorRT-LLM ``release`` on ``backend``.

    ``target_architecture`` is ``config.json``'s ``architectures[0]`` (None: not checked);
    ``drafter_kind`` one of ``causal_lm``, ``eagle1``, ``eagle3``, ``medusa``, ``mtp`` or None;
    ``sm`` the compute capability as an integer (80 = 8.0, 90 = 9.0; None: not checked).
    Errors first. Raises :class:`spectool.errors.ConfigError` on unknown release, method, backend
    or drafter kind (programming or user input errors, not findings).
    """
    check_method(method)
    check_backend(backend)
    info = release_info(release)
    if drafter_kind is not None and drafter_kind not in DRAFTER_KINDS:
        raise ConfigError(
            f"drafter kind {drafter_kind!r}", f"unknown; known: {', '.join(DRAFTER_KINDS)}"
        )
    rel = f"TensorRT-LLM {release}"
    errors: list[Finding] = []
    warnings: list[Finding] = []

    reason = info.unsupported_reason(method, backend)
    if reason is not None:
        alternatives = [b for b in info.backends if info.method(method, b) is not None]
        hint = (
            f"use --trtllm-backend {alternatives[0]}"
            if alternatives
            else f"choose another method; {method} is not available in {rel}"
        )
        errors.append(error(UNSUPPORTED, f"{method} on {backend} with {rel}: {reason}", hint))
        return errors  # the rest presumes the method runs on this backend

    if method == "eagle" and backend == "pytorch":
        warnings.append(
            warning(
                EAGLE_ALIAS,
                f"{rel}'s PyTorch backend treats decoding_type Eagle as Eagle3; EAGLE-1/2 draft "
                "checkpoints are incompatible with it",
                "use an EAGLE-3 drafter with --method eagle3, or the TensorRT backend (≤1.2) for "
                "an EAGLE-1/2 drafter",
            )
        )
        if drafter_kind == "eagle1":
            errors.append(
                error(
                    UNSUPPORTED,
                    f"drafter is an EAGLE-1/2 checkpoint; {rel}'s PyTorch backend loads only "
                    "EAGLE-3 drafters (fc over 3 captured layers, draft_vocab_size)",
                    "use an EAGLE-3 drafter, or --trtllm-backend tensorrt on TensorRT-LLM ≤1.2",
                )
            )
    if method == "eagle" and backend == "tensorrt" and drafter_kind == "eagle3":
        errors.append(
            error(
                UNSUPPORTED,
                f"drafter is an EAGLE-3 checkpoint; {rel}'s TensorRT backend runs EAGLE-1/2 only",
                "use --method eagle3 --trtllm-backend pytorch",
            )
        )
    if method == "eagle3" and drafter_kind == "eagle1":
        errors.append(
            error(
                UNSUPPORTED,
                f"drafter is an EAGLE-1/2 checkpoint; {rel} runs EAGLE-3 drafters for eagle3",
                "use an EAGLE-3 drafter, or --method eagle --trtllm-backend tensorrt (≤1.2)",
            )
        )
    if method == "mtp" and drafter_kind not in (None, "mtp") and release != "main":
        errors.append(
            error(
                UNSUPPORTED,
                f"MTP in {rel} drafts with the target's own MTP layers, not a {drafter_kind} "
                "drafter",
                "drop the drafter; separate MTP drafters need TensorRT-LLM main",
            )
        )

    arch = target_architecture
    if arch is not None:
        if method == "mtp" and arch not in info.mtp_architectures:
            errors.append(
                error(
                    UNSUPPORTED,
                    f"MTP in {rel} needs a target with MTP layers in TensorRT-LLM's model code; "
                    f"{arch} is not one (supported: {', '.join(sorted(info.mtp_architectures))})",
                    "use eagle3, draft_model or ngram for this target",
                )
            )
        if method == "eagle" and backend == "tensorrt" and arch not in info.trt_eagle_architectures:
            errors.append(
                error(
                    UNSUPPORTED,
                    f"the TensorRT backend's EAGLE-1/2 (EagleForCausalLM) is built on LLaMA; "
                    f"target {arch} is not supported "
                    f"(supported: {', '.join(sorted(info.trt_eagle_architectures))})",
                    "use eagle3 on the PyTorch backend with an EAGLE-3 drafter",
                )
            )
        if method == "eagle3" and arch not in info.eagle3_architectures:
            warnings.append(
                warning(
                    ARCH_UNLISTED,
                    f"{rel}'s release notes do not name {arch} as an Eagle3 target (named: "
                    f"{', '.join(sorted(info.eagle3_architectures))})",
                    "the one-model Eagle3 path is model-agnostic since 0.21; measure before "
                    "relying on it",
                )
            )

    warnings += _gate_findings(method, backend, release)

    if sm is not None:
        if sm < info.min_sm:
            errors.append(
                error(
                    UNSUPPORTED,
                    f"GPU {_sm_text(sm)} is below {rel}'s minimum {_sm_text(info.min_sm)} "
                    "(Ampere or newer)",
                    "run on an Ampere, Ada, Hopper or Blackwell GPU",
                )
            )
        elif sm not in info.listed_sms:
            warnings.append(
                warning(
                    SM_UNLISTED,
                    f"GPU {_sm_text(sm)} is not in {rel}'s support matrix "
                    f"({', '.join(_sm_text(s) for s in sorted(info.listed_sms))})",
                    "expect missing kernels; check the release's support matrix",
                )
            )
        if method == "mtp":
            need = info.mtp_min_sm.get(arch or "", info.mtp_min_sm["*"])
            if sm < need:
                errors.append(
                    error(
                        UNSUPPORTED,
                        f"MTP{' for ' + arch if arch else ''} in {rel} needs {_sm_text(need)} or "
                        f"newer (MLA generation kernels); GPU is {_sm_text(sm)}",
                        "run MTP on Hopper (SM 9.0) or newer, or use another method",
                    )
                )
    return errors + warnings


def _gate_findings(method: str, backend: str, release: str) -> list[Finding]:
    """Runtime-gate findings from the gate table (see the module docstring)."""
    from spectool.trtllm.gates import gate_support, two_model_key

    info = release_info(release)
    if backend != "pytorch" or not (info.has_max_concurrency or info.has_draft_len_schedule):
        return []
    support = gate_support(release, method, backend=backend)
    out: list[Finding] = []
    if not support.effective:
        key = two_model_key(release, method)
        alternative = f"build --inert-gate two-model ({key}: false) or " if key else ""
        out.append(
            warning(
                GATE_INERT,
                f"{support.describe()}: TensorRT-LLM {release} keeps speculating at every batch "
                "size",
                f"{alternative}let spectool serve's cost gate pick the baseline above break-even",
            )
        )
    elif release == "main" and support.path == "one_model":
        out.append(
            warning(
                RESUME_BUG,
                f"TensorRT-LLM main, {method} one-model with a runtime gate: acceptance collapses "
                "after the drafter skipped drafting under load and resumes (PR #16888, open)",
                "keep the gate's cut-off above the usual load, or serve the baseline under load "
                "(--speculation auto without a gate)",
            )
        )
    return out
