"""Rules for heads that read the target's hidden states: EAGLE-3, EAGLE-1/2 and Medusa."""

from __future__ import annotations

from spectool.ckpt.inspect import Checkpoint
from spectool.compat.tokens import vocab_size_rule
from spectool.findings import Finding, error

# EAGLE-3 fuses the hidden states of three target layers unless the head's config says otherwise.
DEFAULT_EAGLE3_CAPTURE = 3


def default_capture_layers(num_layers: int) -> list[int]:
    """TensorRT-LLM's default EAGLE-3 capture set ``{1, L//2 - 1, L - 4}``."""
    return sorted({1, num_layers // 2 - 1, num_layers - 4})


def _hidden_rule(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    expected = drafter.target_hidden_size or drafter.hidden_size
    if target.hidden_size and expected and expected != target.hidden_size:
        src = "target_hidden_size" if drafter.target_hidden_size else "hidden_size"
        return [
            error(
                "HIDDEN_SIZE_MISMATCH",
                f"target hidden_size {target.hidden_size} vs head {src} {expected}",
                "This head was trained on another base model; use the head made for this target.",
            )
        ]
    return []


def eagle3_rules(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    findings = _hidden_rule(target, drafter)
    tv = target.vocab_size
    findings += vocab_size_rule(target, drafter, drafter.vocab_size, "vocab_size")
    t2d = drafter.tensor("t2d")
    if (
        t2d is not None
        and t2d.shape
        and tv
        and t2d.shape[0] != tv
        and not any(f.code == "VOCAB_MISMATCH" for f in findings)
    ):
        findings.append(
            error(
                "VOCAB_MISMATCH",
                f"target vocab_size {tv} vs drafter len(t2d) {t2d.shape[0]}",
                "Use a head whose t2d map covers this target's vocabulary.",
            )
        )
    dv = drafter.draft_vocab_size
    full = drafter.vocab_size or tv
    if dv is not None and full is not None and dv < full:
        d2t, head = drafter.tensor("d2t"), drafter.lm_head_rows
        if d2t is None or (d2t.shape and d2t.shape[0] != dv):
            findings.append(
                error(
                    "DRAFT_VOCAB_MAP_MISSING",
                    f"draft_vocab_size {dv} < vocab_size {full} needs a d2t map of {dv} entries; "
                    f"found {list(d2t.shape) if d2t else 'none'}",
                    "Re-export the head with its d2t buffer.",
                )
            )
        if head != dv:
            findings.append(
                error(
                    "DRAFT_LM_HEAD_MISSING",
                    f"draft_vocab_size {dv} needs a draft lm_head of {dv} rows; found {head}",
                    "Re-export the head with its lm_head.",
                )
            )
    fc = drafter.fc
    t_hidden = target.hidden_size
    if (
        fc is not None
        and len(fc.shape) == 2
        and t_hidden
        and not any(f.code == "HIDDEN_SIZE_MISMATCH" for f in findings)
    ):
        capture = drafter.eagle_capture_layers
        n = len(capture) if capture else DEFAULT_EAGLE3_CAPTURE
        if fc.shape[1] != n * t_hidden:
            findings.append(
                error(
                    "HIDDEN_SIZE_MISMATCH",
                    f"EAGLE-3 fc input {fc.shape[1]} != {n} captured layers x target hidden {t_hidden}",
                    "Use the head made for this target.",
                )
            )
    n_layers = target.num_layers
    if n_layers:
        layers = drafter.eagle_capture_layers or default_capture_layers(n_layers)
        missing = [i for i in layers if not -n_layers <= i < n_layers]
        if missing or n_layers < 5:
            findings.append(
                error(
                    "CAPTURE_LAYERS_MISSING",
                    f"EAGLE-3 captures target layers {layers} but the target has {n_layers} layers",
                    "Set eagle3_layers_to_capture to layers the target has, or use another head.",
                )
            )
    return findings


def eagle1_rules(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    findings = _hidden_rule(target, drafter)
    rows = drafter.embed_rows or drafter.vocab_size
    findings += vocab_size_rule(
        target, drafter, rows, "embedding rows" if drafter.embed_rows else "vocab_size"
    )
    fc = drafter.fc
    if (
        fc is not None
        and target.hidden_size
        and not findings
        and fc.shape[1] != 2 * target.hidden_size
    ):
        findings.append(
            error(
                "HIDDEN_SIZE_MISMATCH",
                f"EAGLE-1 fc input {fc.shape[1]} != 2 x target hidden {target.hidden_size}",
                "Use the head made for this target.",
            )
        )
    return findings


def medusa_rules(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    findings: list[Finding] = []
    head0 = next((t for n, t in sorted(drafter.tensors.items()) if n.endswith(".1.weight")), None)
    if head0 is not None and len(head0.shape) == 2:
        rows, width = head0.shape
        if target.hidden_size and width != target.hidden_size:
            findings.append(
                error(
                    "HIDDEN_SIZE_MISMATCH",
                    f"target hidden_size {target.hidden_size} vs Medusa head width {width}",
                    "Use Medusa heads trained for this target.",
                )
            )
        findings += vocab_size_rule(target, drafter, rows, "Medusa head rows")
    return findings
