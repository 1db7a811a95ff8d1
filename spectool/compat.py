"""The checkpoint rules: does this drafter fit this target for this method? Pure: checkpoints
in, findings out (the stable codes are listed in the README).

Engine rules (can TensorRT-LLM or the embedded engine run it?) and memory live elsewhere; these
judge the checkpoints alone, which is what ``--engine none`` reports.
"""

from __future__ import annotations

import re
from pathlib import Path

from spectool.ckpt.inspect import CAUSAL_LM, EAGLE1, EAGLE3, KIND_LABELS, MEDUSA, Checkpoint
from spectool.ckpt.tokenizer import compare_vocabularies
from spectool.errors import BadInputError
from spectool.findings import Finding, error, info, warning

METHODS = ("eagle3", "eagle", "draft_model", "mtp", "ngram", "medusa")
# What each method expects of the drafter checkpoint (None: no drafter checkpoint at all).
EXPECTED_KIND = {
    "eagle3": EAGLE3,
    "eagle": EAGLE1,
    "draft_model": CAUSAL_LM,
    "medusa": MEDUSA,
    "mtp": None,
    "ngram": None,
}
METHOD_FOR_KIND = {EAGLE3: "eagle3", EAGLE1: "eagle", CAUSAL_LM: "draft_model", MEDUSA: "medusa"}
# EAGLE-3 fuses the hidden states of three target layers unless the head's config says otherwise.
DEFAULT_EAGLE3_CAPTURE = 3
# The longest draft spectool accepts. Acceptance falls with each position (published deployments
# draft 1-8 tokens; Medusa/EAGLE trees stay under 64 draft tokens), and every engine reserves
# max_draft_len + 1 KV slots and token-budget entries per sequence and step.
MAX_DRAFT_LEN = 64


def resolve_method(method: str, target: Checkpoint, drafter: Checkpoint | None) -> str:
    """``auto`` -> the method the drafter's weights call for (mtp / ngram without a drafter)."""
    if method != "auto":
        if method not in METHODS:
            raise BadInputError(
                "--method", f"unknown method {method!r}; choose from auto, {', '.join(METHODS)}"
            )
        return method
    if drafter is None:
        return "mtp" if target.mtp_layers else "ngram"
    return METHOD_FOR_KIND.get(drafter.kind, "draft_model")


def default_capture_layers(num_layers: int) -> list[int]:
    """TensorRT-LLM's default EAGLE-3 capture set ``{1, L//2 - 1, L - 4}``."""
    return sorted({1, num_layers // 2 - 1, num_layers - 4})


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
    if method == "mtp":
        return findings + _mtp_rules(target, drafter, max_draft_len)
    if method == "ngram":
        if drafter is not None:
            findings.append(
                warning(
                    "DRAFTER_IGNORED",
                    f"method ngram drafts from the prompt; drafter {drafter.ref} is unused",
                    "Drop the drafter argument, or choose a method that uses it.",
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
    expected = EXPECTED_KIND[method]
    if drafter.kind != expected:
        findings.append(_format_mismatch(method, drafter))
        return findings
    if method == "draft_model":
        findings += _token_space_rules(target, drafter)
        findings += _cost_rule(target, drafter)
    elif method == "eagle3":
        findings += _eagle3_rules(target, drafter)
    elif method == "eagle":
        findings += _eagle1_rules(target, drafter)
    elif method == "medusa":
        findings += _medusa_rules(target, drafter)
    findings += _base_model_rule(target, drafter)
    findings += _soft_rules(target, drafter, method, max_seq_len)
    return findings


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
            f"Use --method {METHOD_FOR_KIND[kind]} for this checkpoint, or a small causal LM of "
            "the same tokenizer as the draft model.",
        )
    hint = (
        f"This checkpoint calls for --method {METHOD_FOR_KIND[kind]}."
        if kind in METHOD_FOR_KIND
        else "Check that the drafter path points at the right checkpoint."
    )
    return error(
        "METHOD_FORMAT_MISMATCH",
        f"method {method} expects {KIND_LABELS.get(EXPECTED_KIND[method] or '', 'no drafter')}"
        f" but {drafter.ref} holds {label}",
        hint,
    )


def _vocab_size_rule(
    target: Checkpoint, drafter: Checkpoint, drafter_vocab: int | None, what: str
) -> list[Finding]:
    if drafter_vocab is None or target.vocab_size is None or drafter_vocab == target.vocab_size:
        return []
    return [
        error(
            "VOCAB_MISMATCH",
            f"target vocab_size {target.vocab_size} vs drafter {what} {drafter_vocab}: the two do "
            "not share a token space",
            "Use a drafter trained for this target's tokenizer.",
        )
    ]


def _token_space_rules(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    """A standalone draft model must speak the target's tokens: compare tokenizers first."""
    t_tok, d_tok = target.tokenizer, drafter.tokenizer
    findings: list[Finding] = []
    if t_tok is not None and d_tok is not None:
        cmp = compare_vocabularies(t_tok, d_tok)
        if cmp.relation == "different":
            detail = (
                cmp.example
                or f"{cmp.only_target} ids only in the target, {cmp.only_drafter} only in the drafter"
            )
            return [
                error(
                    "VOCAB_MISMATCH",
                    f"tokenizers differ: target {t_tok.size} tokens, drafter {d_tok.size} tokens; {detail}",
                    "Use a drafter from the target's model family (same tokenizer).",
                )
            ]
        if cmp.relation == "target_superset":
            findings.append(
                warning(
                    "TOKENIZER_SUPERSET",
                    f"the target's tokenizer has {cmp.only_target} tokens the drafter never saw "
                    f"(target {t_tok.size}, drafter {d_tok.size}; shared ids agree)",
                    "Fine for acceptance on ordinary text; those tokens will always be rejected.",
                )
            )
        elif cmp.relation == "drafter_superset":
            findings.append(
                warning(
                    "TOKENIZER_SUPERSET",
                    f"the drafter's tokenizer has {cmp.only_drafter} tokens the target lacks "
                    f"(target {t_tok.size}, drafter {d_tok.size}; shared ids agree)",
                    "Drafts of those ids are always rejected; harmless if rare.",
                )
            )
        if target.vocab_size and drafter.vocab_size and target.vocab_size != drafter.vocab_size:
            findings.append(
                warning(
                    "PADDED_VOCAB_DIFFERS",
                    f"same tokenizer but embedding rows padded differently: target vocab_size "
                    f"{target.vocab_size}, drafter {drafter.vocab_size}",
                    "TensorRT-LLM and spectool handle this; vLLM refuses such pairs.",
                )
            )
        findings += _special_token_rule(target, drafter)
        return findings
    findings += _vocab_size_rule(target, drafter, drafter.vocab_size, "vocab_size")
    if not findings:
        missing = "target" if t_tok is None else "drafter"
        findings.append(
            info(
                "TOKENIZER_UNVERIFIED",
                f"no tokenizer.json on the {missing} side: token space judged by vocab_size alone "
                f"({target.vocab_size})",
                "Add the tokenizer files to compare the vocabularies themselves.",
            )
        )
    return findings


def _special_token_rule(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    t_eos, d_eos = set(target.eos_token_ids), set(drafter.eos_token_ids)
    if t_eos and d_eos and not d_eos <= t_eos:
        return [
            warning(
                "EOS_DIFFERS",
                f"drafter eos {sorted(d_eos)} vs target eos {sorted(t_eos)}",
                "The target decides when to stop; a drafter stopping early only costs acceptance.",
            )
        ]
    return []


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


def _eagle3_rules(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    findings = _hidden_rule(target, drafter)
    tv = target.vocab_size
    findings += _vocab_size_rule(target, drafter, drafter.vocab_size, "vocab_size")
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


def _eagle1_rules(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    findings = _hidden_rule(target, drafter)
    rows = drafter.embed_rows or drafter.vocab_size
    findings += _vocab_size_rule(
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


def _medusa_rules(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
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
        findings += _vocab_size_rule(target, drafter, rows, "Medusa head rows")
    return findings


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
                )
            )
    if declared is not None and present and present != declared:
        findings.append(
            warning(
                "MTP_LAYERS_DIFFER",
                f"config declares {declared} MTP layers, weights hold {present}",
                "spectool uses the smaller number.",
            )
        )
    return findings


def _cost_rule(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    """A draft model must be much cheaper than the target; a swapped pair is not."""
    t_layers, d_layers = target.num_layers, drafter.num_layers
    t_params, d_params = target.num_parameters, drafter.num_parameters
    deeper = bool(t_layers and d_layers and d_layers >= t_layers)
    larger = bool(t_params and d_params >= t_params)
    if not (deeper or larger):
        return []
    return [
        warning(
            "DRAFTER_NOT_CHEAPER",
            f"the drafter is not cheaper than the target: {_layers(d_layers)} and "
            f"{_count(d_params)} parameters against the target's {_layers(t_layers)} and "
            f"{_count(t_params)}; each draft token costs about as much as a target step",
            "Pass the target first and the drafter second, or use a drafter with far fewer "
            "layers and parameters (a tenth of the target's is typical).",
        )
    ]


def _layers(n: int | None) -> str:
    return "? layers" if n is None else f"{n} layer{'' if n == 1 else 's'}"


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


_HF_CACHE_RE = re.compile(r"^models--([^/]+?)--([^/]+)$")


def _model_ids(target: Checkpoint) -> tuple[set[str], set[str]]:
    """(known repo ids, plausible names) of the target, lower-cased.

    A repo id is known from a Hub reference (one that has a revision), a Hugging Face cache path
    (``models--org--name``) or an ``org/name`` ``_name_or_path`` in its config. A name (the last
    path component) comes from those and from the folder's own name, which a person chose and
    so can confirm an identity but never refute one.
    """
    ids: set[str] = set()
    names: set[str] = set()
    if target.revision is not None and "/" in target.ref:
        ids.add(target.ref.split("@")[0].lower())
    for part in (*Path(target.ref).parts, *target.path.parts):
        m = _HF_CACHE_RE.match(part)
        if m:
            ids.add(f"{m.group(1)}/{m.group(2)}".lower())
    name_or_path = target.config.get("_name_or_path")
    if isinstance(name_or_path, str) and name_or_path:
        if _looks_like_repo_id(name_or_path):
            ids.add(name_or_path.lower())
        else:
            names.add(_last_name(name_or_path))
    names |= {i.split("/")[-1] for i in ids}
    names |= {_last_name(target.ref), _last_name(str(target.path))}
    return ids, names


def _looks_like_repo_id(ref: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+", ref))


def _last_name(ref: str) -> str:
    return ref.rstrip("/").split("/")[-1].split("@")[0].lower()


def _base_model_rule(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    """The head's ``base_model_name_or_path`` against the target's identity, where known.

    A local copy of the base model (``/models/vicuna-7b-v1.3`` for ``lmsys/vicuna-7b-v1.3``)
    matches by name; a mismatch is an error only when the target's repo id is known, otherwise
    a warning that the identity could not be verified.
    """
    base = drafter.base_model
    if not base:
        return []
    ids, names = _model_ids(target)
    base_id = base.split("@")[0].lower() if _looks_like_repo_id(base.split("@")[0]) else None
    if (base_id is not None and base_id in ids) or _last_name(base) in names:
        return []
    if ids:
        return [
            error(
                "BASE_MODEL_MISMATCH",
                f"{drafter.ref} names base model {base!r}, target is {' / '.join(sorted(ids))}",
                "Use the head trained for this target (heads are tied to their base model's "
                "hidden states).",
            )
        ]
    return [
        warning(
            "BASE_MODEL_UNVERIFIED",
            f"{drafter.ref} names base model {base!r}; the identity of target {target.ref} "
            "could not be verified (a local folder of another name, no _name_or_path)",
            "Make sure the target is that base model: heads are tied to their base model's "
            "hidden states. Naming the folder after the model silences this.",
        )
    ]


def _soft_rules(
    target: Checkpoint, drafter: Checkpoint, method: str, max_seq_len: int | None
) -> list[Finding]:
    findings: list[Finding] = []
    t_ctx, d_ctx = target.max_position_embeddings, drafter.max_position_embeddings
    if t_ctx and d_ctx and d_ctx < t_ctx:
        limit = (
            f"; requested max_seq_len {max_seq_len} exceeds it"
            if max_seq_len and max_seq_len > d_ctx
            else ""
        )
        findings.append(
            warning(
                "DRAFT_CONTEXT_SHORTER",
                f"drafter max_position_embeddings {d_ctx} < target {t_ctx}{limit}",
                "Acceptance may drop on long contexts; measure with your prompt lengths.",
            )
        )
    if target.dtype and drafter.dtype and target.dtype != drafter.dtype:
        findings.append(
            warning(
                "DTYPE_DIFFERS",
                f"drafter dtype {drafter.dtype} vs target {target.dtype}",
                "Engines cast the drafter to the serving dtype; check memory and acceptance.",
            )
        )
    if (
        method in ("eagle3", "eagle")
        and drafter.architecture
        and "eagle" not in drafter.architecture.lower()
    ):
        findings.append(
            info(
                "ARCH_STRING_UNINFORMATIVE",
                f"{drafter.ref} declares architectures {drafter.architecture!r}; its EAGLE generation was read from the weights",
                "Tools that dispatch on the architecture string (older SGLang) need --method set explicitly.",
            )
        )
    return findings
