"""The checkpoint rules: does this drafter fit this target for this method? Pure: checkpoints
in, findings out (the stable codes are listed in the README).

Engine rules (can TensorRT-LLM or the embedded engine run it?) and memory live elsewhere; these
judge the checkpoints alone, which is what ``--engine none`` reports.
"""

from __future__ import annotations

from collections.abc import Callable

from spectool import methods
from spectool.ckpt.inspect import CAUSAL_LM, EAGLE1, EAGLE3, KIND_LABELS, MEDUSA, Checkpoint
from spectool.compat.heads import (
    DEFAULT_EAGLE3_CAPTURE,
    default_capture_layers,
    eagle1_rules,
    eagle3_rules,
    medusa_rules,
)
from spectool.compat.identity import base_model_rule
from spectool.compat.quiet import quiet_rules
from spectool.compat.tokens import cost_rule, token_space_rules
from spectool.errors import BadInputError
from spectool.findings import Finding, error, info, warning

__all__ = [
    "DEFAULT_EAGLE3_CAPTURE",
    "MAX_DRAFT_LEN",
    "PAIR_RULES",
    "check_pair",
    "default_capture_layers",
    "resolve_method",
]

# The longest draft spectool accepts. Acceptance falls with each position (published deployments
# draft 1-8 tokens; Medusa/EAGLE trees stay under 64 draft tokens), and every engine reserves
# max_draft_len + 1 KV slots and token-budget entries per sequence and step.
MAX_DRAFT_LEN = 64


def resolve_method(method: str, target: Checkpoint, drafter: Checkpoint | None) -> str:
    """``auto`` -> the method the drafter's weights call for (mtp / ngram without a drafter)."""
    if method != "auto":
        if not methods.is_method(method):
            raise BadInputError("--method", methods.unknown_method_problem(method))
        return method
    if drafter is None:
        return "mtp" if target.mtp_layers else "ngram"
    return methods.METHOD_FOR_KIND.get(drafter.kind, "draft_model")


def check_pair(
    target: Checkpoint,
    drafter: Checkpoint | None,
    method: str,
    *,
    max_draft_len: int | None = None,
    max_seq_len: int | None = None,
) -> list[Finding]:
    """Every checkpoint-level finding for ``drafter`` speculating for ``target`` with ``method``."""
    findings: list[Finding] = []
    if max_draft_len is not None and not 1 <= max_draft_len <= MAX_DRAFT_LEN:
        findings.append(
            error(
                "MAX_DRAFT_LEN_INVALID",
                f"max_draft_len {max_draft_len} < 1"
                if max_draft_len < 1
                else f"max_draft_len {max_draft_len} is beyond what any engine runs "
                f"(at most {MAX_DRAFT_LEN})",
                f"Give --max-draft-len between 1 and {MAX_DRAFT_LEN} (1-8 is typical).",
            )
        )
    if target.kind != CAUSAL_LM:
        findings.append(
            error(
                "TARGET_NOT_A_CAUSAL_LM",
                f"target {target.ref} holds {KIND_LABELS[target.kind]} weights, not a causal LM",
                "Pass the full target model first and the drafter second.",
            )
        )
        return findings
    spec = methods.get(method)
    if spec.uses_native_layers:
        return findings + _mtp_rules(target, drafter, max_draft_len)
    if not spec.takes_drafter:
        if drafter is not None:
            findings.append(
                warning(
                    "DRAFTER_IGNORED",
                    f"method {method} drafts from the prompt; drafter {drafter.ref} is unused",
                    "Drop the drafter argument, or choose a method that uses it.",
                    evidence={"method": method, "drafter": drafter.ref},
                )
            )
        return findings
    if drafter is None:
        findings.append(
            error(
                "DRAFTER_REQUIRED",
                f"method {method} needs a drafter checkpoint",
                "Pass the drafter as the second argument or use a profile.",
            )
        )
        return findings
    if drafter.kind != spec.drafter_kind:
        findings.append(_format_mismatch(method, drafter))
        return findings
    findings += PAIR_RULES[method](target, drafter)
    findings += base_model_rule(target, drafter)
    findings += quiet_rules(target, drafter, method, max_seq_len)
    findings += _arch_string_rule(drafter, method)
    return findings


def _draft_model_rules(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    return token_space_rules(target, drafter) + cost_rule(target, drafter)


# The pair rules of every method that takes a drafter checkpoint (tests/test_methods.py checks
# that each such method of spectool.methods has an entry).
PAIR_RULES: dict[str, Callable[[Checkpoint, Checkpoint], list[Finding]]] = {
    "draft_model": _draft_model_rules,
    "eagle3": eagle3_rules,
    "eagle": eagle1_rules,
    "medusa": medusa_rules,
}


def _format_mismatch(method: str, drafter: Checkpoint) -> Finding:
    kind = drafter.kind
    label = KIND_LABELS[kind]
    if method == "eagle3" and kind == EAGLE1:
        return error(
            "WRONG_EAGLE_GENERATION_EAGLE1_AS_EAGLE3",
            f"{drafter.ref} holds EAGLE-1/2 weights (fc {list(drafter.fc.shape) if drafter.fc else '?'}, "
            "2x hidden input) but eagle3 was asked for (expects fc 3x hidden, midlayer.*, d2t)",
            "Use an EAGLE-3 head (e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B), or --method eagle on "
            "the legacy TensorRT backend.",
        )
    if method == "eagle" and kind == EAGLE3:
        return error(
            "WRONG_EAGLE_GENERATION_EAGLE3_AS_EAGLE1",
            f"{drafter.ref} holds EAGLE-3 weights (fc {list(drafter.fc.shape) if drafter.fc else '?'}) "
            "but eagle (EAGLE-1/2) was asked for (expects fc 2x hidden, layers.0.*)",
            "Use --method eagle3 (TensorRT-LLM decoding_type Eagle3).",
        )
    if method == "draft_model" and kind in (EAGLE1, EAGLE3, MEDUSA):
        return error(
            "NOT_A_STANDALONE_LM",
            f"{drafter.ref} is an {label} (needs the target's hidden states; no full embedding "
            "and decoder stack), not a model that can draft on its own",
            f"Use --method {methods.METHOD_FOR_KIND[kind]} for this checkpoint, or a small causal LM of "
            "the same tokenizer as the draft model.",
        )
    hint = (
        f"This checkpoint calls for --method {methods.METHOD_FOR_KIND[kind]}."
        if kind in methods.METHOD_FOR_KIND
        else "Check that the drafter path points at the right checkpoint."
    )
    return error(
        "METHOD_FORMAT_MISMATCH",
        f"method {method} expects {KIND_LABELS.get(methods.expected_kind(method) or '', 'no drafter')}"
        f" but {drafter.ref} holds {label}",
        hint,
    )


def _mtp_rules(
    target: Checkpoint, drafter: Checkpoint | None, max_draft_len: int | None
) -> list[Finding]:
    findings: list[Finding] = []
    if drafter is not None and drafter is not target:
        findings.append(
            error(
                "METHOD_FORMAT_MISMATCH",
                f"method mtp uses the target's own MTP layers; drafter {drafter.ref} "
                f"({KIND_LABELS[drafter.kind]}) cannot serve as MTP layers",
                "Drop the drafter argument (MTP drafts with the target's native layers).",
            )
        )
    declared, present = target.mtp_declared_layers, target.mtp_tensor_layers
    if not target.mtp_layers:
        if declared:
            why = f"config declares {declared} MTP layer(s) but the weights hold none (stripped by an export?)"
        else:
            why = (
                f"{target.architecture or target.model_type} declares no MTP layers "
                "(no num_nextn_predict_layers / mtp_num_hidden_layers) and holds no MTP tensors"
            )
        findings.append(
            error(
                "NO_NATIVE_MTP",
                f"target {target.ref}: {why}",
                "Use eagle3 or draft_model for this target, or a checkpoint that keeps its MTP layers.",
            )
        )
        return findings
    n = target.mtp_layers
    if max_draft_len is not None and max_draft_len > n:
        if n == 1:
            findings.append(
                info(
                    "MTP_DRAFT_LEN",
                    f"max_draft_len {max_draft_len} > {n} native MTP layer: TensorRT-LLM replays the "
                    "single layer (MTP-Eagle); acceptance falls with each extra step",
                    "Tune the draft length (spectool tune); 1-3 is typical.",
                )
            )
        else:
            findings.append(
                warning(
                    "MTP_DRAFT_LEN",
                    f"max_draft_len {max_draft_len} > {n} native MTP layers: vanilla MTP is clamped to {n}",
                    f"Use --max-draft-len {n} or less.",
                    file=str(target.path / "config.json"),
                    evidence={"max_draft_len": max_draft_len, "mtp_layers": n},
                )
            )
    if declared is not None and present and present != declared:
        findings.append(
            warning(
                "MTP_LAYERS_DIFFER",
                f"config declares {declared} MTP layers, weights hold {present}",
                "spectool uses the smaller number.",
                file=str(target.path / "config.json"),
                evidence={"declared": declared, "in_weights": present},
            )
        )
    return findings


def _arch_string_rule(drafter: Checkpoint, method: str) -> list[Finding]:
    if (
        "eagle_head" in methods.get(method).needs
        and drafter.architecture
        and "eagle" not in drafter.architecture.lower()
    ):
        return [
            info(
                "ARCH_STRING_UNINFORMATIVE",
                f"{drafter.ref} declares architectures {drafter.architecture!r}; its EAGLE generation was read from the weights",
                "Tools that dispatch on the architecture string (older SGLang) need --method set explicitly.",
            )
        ]
    return []
