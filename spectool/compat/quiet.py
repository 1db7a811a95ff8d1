"""The quiet acceptance killers: pairs that load, run and verify exactly, yet accept far fewer
tokens than the drafter's model card promises. Each rule fires only on evidence in the files
(config, tensor table, tokenizer, generation config, model card) and cites where the failure was
reported; the README's "Why acceptance is low" lists the same codes and sources.
"""

from __future__ import annotations

from spectool import methods
from spectool.ckpt.card import (
    card_base_models,
    chat_template,
    render_template,
    rope_of,
    special_sequence,
)
from spectool.ckpt.inspect import CAUSAL_LM, EAGLE1, EAGLE3, MEDUSA, Checkpoint
from spectool.findings import Finding, info, warning

LOWER = "acceptance will be lower than published"
# An EAGLE-3 draft vocabulary below this share of the target's tokens leaves common tokens out.
# Published heads keep 32000 of 128256 (Llama-3, 25%), of 151936 (Qwen3, 21%) and of 201088
# (gpt-oss, 16%); FR-Spec (arXiv 2502.14856) reports acceptance falling as the set shrinks.
MIN_DRAFT_VOCAB_SHARE = 1 / 8


def _cfg(ckpt: Checkpoint) -> str:
    return str(ckpt.path / "config.json")


def _at(ckpt: Checkpoint, name: str = "config.json") -> str:
    """Where the evidence is, for the one-line message: the reference and the file's name."""
    return f"{ckpt.ref.rstrip('/')}/{name}"


def quiet_rules(
    target: Checkpoint, drafter: Checkpoint, method: str, max_seq_len: int | None
) -> list[Finding]:
    """Every warning of this module for ``drafter`` speculating for ``target`` with ``method``."""
    findings = context_rule(target, drafter, max_seq_len)
    findings += precision_rules(target, drafter)
    if drafter.kind == CAUSAL_LM:
        findings += tied_embeddings_rule(drafter)
        findings += special_token_rule(target, drafter)
        findings += chat_template_rule(target, drafter)
    if drafter.kind in (EAGLE1, EAGLE3) and "eagle_head" in methods.get(method).needs:
        findings += rope_rule(target, drafter)
    if drafter.kind == EAGLE3:
        findings += draft_vocab_rule(target, drafter)
    if drafter.kind == MEDUSA:
        findings += medusa_heads_rule(drafter)
    return findings


def tied_embeddings_rule(ckpt: Checkpoint) -> list[Finding]:
    """``tie_word_embeddings`` against the tensors present, where the config states it.

    Reported: a drafter whose output projection is not the trained one drafts garbage and
    accepts ~0%: https://github.com/vllm-project/vllm/pull/46435 (draft LM head not set, 0.00%
    acceptance), https://github.com/vllm-project/vllm/pull/28549 (a drafter's own lm_head
    overridden by another's).
    """
    tie = ckpt.config.get("tie_word_embeddings")
    if not isinstance(tie, bool) or ckpt.embed_rows is None:
        return []
    head = ckpt.tensor("lm_head.weight")
    evidence = {"tie_word_embeddings": tie, "lm_head.weight": list(head.shape) if head else None}
    if not tie and head is None:
        what = (
            "config says tie_word_embeddings false but the weights hold no lm_head.weight: "
            "engines load an untrained output projection"
        )
    elif tie and head is not None:
        what = (
            f"config says tie_word_embeddings true but the weights hold a separate lm_head.weight "
            f"{list(head.shape)}: engines tie it to embed_tokens and drop the trained one"
        )
    else:
        return []
    return [
        warning(
            "TIED_EMBEDDINGS_CONTRADICT",
            f"{_at(ckpt)}: {what}; {LOWER} (drafts from the wrong projection are rejected)",
            "Fix tie_word_embeddings in the drafter's config.json to match its tensors.",
            file=_cfg(ckpt),
            evidence=evidence,
        )
    ]


def medusa_heads_rule(drafter: Checkpoint) -> list[Finding]:
    """Declared Medusa heads against the heads in the weights.

    Reported: https://github.com/FasterDecoding/Medusa/issues/76 (Medusa configs without, or
    with another, ``medusa_num_heads`` than the weights: loaders build the declared number).
    """
    declared = drafter.config.get("medusa_num_heads", drafter.config.get("num_medusa_heads"))
    present = drafter.medusa_heads
    if not isinstance(declared, int) or isinstance(declared, bool) or not present:
        return []
    if declared == present:
        return []
    cost = (
        f"only {declared} of the {present} trained heads draft (shorter drafts)"
        if declared < present
        else f"{declared - present} declared heads have no weights (their drafts are noise)"
    )
    return [
        warning(
            "MEDUSA_HEADS_DIFFER",
            f"{_at(drafter)}: declares medusa_num_heads {declared}, the weights hold "
            f"{present} heads; {cost}; {LOWER}",
            f"Set medusa_num_heads to {present} (and draft at most {present} tokens).",
            file=_cfg(drafter),
            evidence={"medusa_num_heads": declared, "heads_in_weights": present},
        )
    ]


def rope_rule(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    """An EAGLE head's rope settings against the target's, where the head's config states any.

    Reported: https://github.com/vllm-project/vllm-ascend/issues/6612 (an EAGLE-3 head with
    another rope_theta than Qwen3-235B: accuracy and acceptance drop; engines that share one
    rope table run the head with the target's), https://github.com/sgl-project/SpecForge/pull/270
    (heads trained ignoring the config's rope_theta). A head trained for Llama-3 (theta 5e5, no
    rope_scaling) on Llama-3.1 (llama3 x8) is the same-architecture, same-size case:
    https://github.com/vllm-project/vllm/issues/9565 (yuhuili/EAGLE-LLaMA3-Instruct-70B on
    Llama-3.1-70B, far below the paper's speed-up).
    """
    head, tgt = rope_of(drafter.config), rope_of(target.config)
    if not head.stated:
        return []  # the head states no rope: no evidence either way (yuhuili's EAGLE-3 heads)
    theta_differs = (
        head.theta is not None and tgt.theta is not None and head.theta != tgt.theta
    ) or (head.theta is not None and tgt.theta is None and head.theta != 10000.0)
    scaling_differs = head.scaling != tgt.scaling
    if not (theta_differs or scaling_differs):
        return []
    why = (
        "trained without the target's rope_scaling"
        if scaling_differs and head.scaling is None
        else "trained with other rope settings"
    )
    return [
        warning(
            "ROPE_MISMATCH",
            f"{_at(drafter)}: head rope ({head.describe()}) vs target ({tgt.describe()}): {why}, "
            f"likely for another target of this architecture; {LOWER}",
            "Use the head trained for this target (same rope_theta and rope_scaling).",
            file=_cfg(drafter),
            evidence={"drafter_rope": head.describe(), "target_rope": tgt.describe()},
        )
    ]


def context_rule(target: Checkpoint, drafter: Checkpoint, max_seq_len: int | None) -> list[Finding]:
    """The drafter's trained context against the deployment's ``--max-seq-len``.

    Reported: https://github.com/sgl-project/sglang/issues/6783 (a 2048-position EAGLE-3 head
    slower than no speculation beyond 2k tokens), https://github.com/SafeAILab/EAGLE/issues/311
    (the training --max-length caps the head's useful context),
    https://github.com/vllm-project/vllm/issues/48894 (positions past 2048 crash the head).
    Without ``--max-seq-len`` the deployment's length is unknown: an info, not a warning.
    """
    t_ctx, d_ctx = target.max_position_embeddings, drafter.max_position_embeddings
    if not d_ctx:
        return []
    evidence = {
        "drafter_max_position_embeddings": d_ctx,
        "target_max_position_embeddings": t_ctx,
        "max_seq_len": max_seq_len,
    }
    if max_seq_len and max_seq_len > d_ctx:
        return [
            warning(
                "DRAFT_CONTEXT_SHORTER",
                f"{_at(drafter)}: max_position_embeddings {d_ctx} < deployment max_seq_len {max_seq_len}: "
                f"past position {d_ctx} the drafter runs where it was never trained; {LOWER} on "
                "long contexts",
                f"Keep --max-seq-len at or below {d_ctx}, or use a drafter trained on longer contexts.",
                file=_cfg(drafter),
                evidence=evidence,
            )
        ]
    if t_ctx and d_ctx < t_ctx and not max_seq_len:
        return [
            info(
                "DRAFT_CONTEXT_SHORTER",
                f"drafter max_position_embeddings {d_ctx} < target {t_ctx}",
                f"Acceptance falls past {d_ctx} tokens; pass --max-seq-len to judge your deployment.",
                file=_cfg(drafter),
                evidence=evidence,
            )
        ]
    return []


def precision_rules(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    """Dtype and quantisation a head was not trained in.

    Reported: https://github.com/vllm-project/vllm/issues/9534 (a float16 EAGLE head on an FP8
    target: acceptance 0), https://github.com/vllm-project/vllm-ascend/issues/5974 (EAGLE-3 on a
    QuaRot W8A8 target: acceptance drops), https://github.com/NVIDIA/TensorRT-LLM/pull/18905
    (an EAGLE-3 head on Llama-4's FP8 checkpoint: acceptance length 1.01, "wrong head for the
    FP8 checkpoint"), https://github.com/NVIDIA/TensorRT-LLM/issues/3207 (EAGLE quantisation
    unsupported). float16 against bfloat16 alone is an info: both work
    (https://github.com/SafeAILab/EAGLE/issues/259).
    """
    findings: list[Finding] = []
    head = drafter.kind in (EAGLE1, EAGLE3, MEDUSA)
    t_quant = _quant(target)
    d_quant = _quant(drafter)
    # A quantised export names the model it was made from in its card (RedHatAI, nvidia FP8
    # exports); natively quantised releases (gpt-oss MXFP4, DeepSeek-V3 FP8) name none, and
    # their heads were trained on the quantised model itself.
    t_origin = card_base_models(target.path) if t_quant else ()
    if head and t_quant and t_origin and not d_quant:
        findings.append(
            warning(
                "QUANTIZED_TARGET_HEAD",
                f"{_at(target)}: the target is a quantised ({t_quant}) export of {t_origin[0]} "
                f"and head {drafter.ref} states no quantisation: it was trained on unquantised "
                f"hidden states; {LOWER}",
                "Use a head trained on this quantised target, or serve the unquantised target.",
                file=_cfg(target),
                evidence={
                    "target_quantization": t_quant,
                    "target_card_base_model": t_origin[0],
                    "drafter_quantization": None,
                },
            )
        )
    if head and d_quant and not t_quant:
        findings.append(
            warning(
                "HEAD_QUANTIZED",
                f"{_at(drafter)}: the head is quantised ({d_quant}) for an unquantised target; "
                f"heads are trained in 16-bit and their drafts shift when quantised; {LOWER}",
                "Serve the head in the precision it was trained in (its torch_dtype).",
                file=_cfg(drafter),
                evidence={"drafter_quantization": d_quant},
            )
        )
    if target.dtype and drafter.dtype and target.dtype != drafter.dtype and not d_quant:
        findings.append(
            info(
                "DTYPE_DIFFERS",
                f"drafter dtype {drafter.dtype} vs target {target.dtype}",
                "Engines cast the drafter to the serving dtype; check memory and acceptance.",
                file=_cfg(drafter),
                evidence={"drafter_dtype": drafter.dtype, "target_dtype": target.dtype},
            )
        )
    return findings


def _quant(ckpt: Checkpoint) -> str | None:
    q = ckpt.text_config.get("quantization_config")
    if not isinstance(q, dict):
        return None
    method = q.get("quant_method") or q.get("quant_algo") or "quantized"
    return str(method)


def special_token_rule(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    """A standalone drafter's start token against the target's.

    Reported: https://github.com/SafeAILab/EAGLE/issues/132 (acceptance far below the paper's
    with "incorrect ... templates"), https://github.com/SafeAILab/EAGLE/issues/67 (a drafter
    must be trained on the target's own conversation format). The target's bos starts every
    prompt; a drafter trained with another sees an id it never saw in that place. The tokenizers'
    bos tokens (what is prepended) decide; config ``bos_token_id`` only where neither tokenizer
    names one (configs carry stale defaults: JackFram/llama-68m says 0, its tokenizer adds 1).
    """
    t_tok, d_tok = target.tokenizer, drafter.tokenizer
    t_bos = t_tok.bos_token if t_tok else None
    d_bos = d_tok.bos_token if d_tok else None
    if t_bos or d_bos:
        if not (t_bos and d_bos) or t_bos == d_bos:
            return []
        diffs = {"bos_token": (t_bos, d_bos)}
        source = "tokenizer_config.json"
    else:
        t, d = _special_id(target, "bos_token_id"), _special_id(drafter, "bos_token_id")
        if t is None or d is None or t == d:
            return []
        diffs = {"bos_token_id": (t, d)}
        source = "config.json"
    listed = ", ".join(f"{k} {t!r} vs {d!r}" for k, (t, d) in diffs.items())
    return [
        warning(
            "SPECIAL_TOKENS_DIFFER",
            f"{_at(drafter, source)}: target vs drafter {listed}: the drafter sees another start "
            f"token for the same conversation; {LOWER}",
            "Use a drafter with the target's special tokens (the same model family and release).",
            file=str(drafter.path / source),
            evidence={k: {"target": t, "drafter": d} for k, (t, d) in diffs.items()},
        )
    ]


def _special_id(ckpt: Checkpoint, key: str) -> int | None:
    for source in (ckpt.generation_config, ckpt.config):
        value = source.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def chat_template_rule(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    """Both chat templates rendered on one conversation: the special tokens around the words.

    Reported: https://github.com/SafeAILab/EAGLE/issues/132 (wrong templates: acceptance length
    2.3 instead of 3.0), https://github.com/SafeAILab/EAGLE/issues/67. Only the special-token
    sequence is compared (wording such as a default date may differ without cost).
    """
    t_tok, d_tok = target.tokenizer, drafter.tokenizer
    t_tpl, d_tpl = chat_template(target.path), chat_template(drafter.path)
    if not (t_tok and d_tok and t_tpl and d_tpl) or t_tpl == d_tpl:
        return []
    t_text = render_template(t_tpl, t_tok.bos_token, t_tok.eos_token)
    d_text = render_template(d_tpl, d_tok.bos_token, d_tok.eos_token)
    if t_text is None or d_text is None:
        return []
    specials = set(t_tok.special_tokens) | set(d_tok.special_tokens)
    t_seq, d_seq = special_sequence(t_text, specials), special_sequence(d_text, specials)
    if t_seq == d_seq:
        return []
    jinja = drafter.path / "chat_template.jinja"
    name = jinja.name if jinja.is_file() else "tokenizer_config.json"
    return [
        warning(
            "CHAT_TEMPLATE_DIFFERS",
            f"{_at(drafter, name)}: the chat templates frame one conversation with other special tokens (target "
            f"{' '.join(t_seq) or 'none'}; drafter {' '.join(d_seq) or 'none'}): the drafter "
            f"sees a format it was not trained on; {LOWER}",
            "Use a drafter trained with the target's chat template.",
            file=str(drafter.path / name),
            evidence={"target_specials": list(t_seq), "drafter_specials": list(d_seq)},
        )
    ]


def draft_vocab_rule(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    """An EAGLE-3 draft vocabulary (``d2t``) too small to hold the target's frequent tokens.

    Reported: https://github.com/sgl-project/sglang/issues/4153 (FR-Spec truncated draft
    vocabularies), https://github.com/sgl-project/SpecForge/pull/76 (a draft vocabulary larger
    than the tokens seen in training, padded with unseen ones). Judged from sizes only: the
    d2t length against the target's tokenizer (or vocab_size).
    """
    dv = drafter.draft_vocab_size
    d2t = drafter.tensor("d2t")
    size = d2t.shape[0] if d2t is not None and d2t.shape else dv
    full = target.tokenizer.size if target.tokenizer else target.vocab_size
    if not size or not full or size >= full * MIN_DRAFT_VOCAB_SHARE:
        return []
    return [
        warning(
            "DRAFT_VOCAB_NARROW",
            f"{_at(drafter)}: the draft vocabulary (d2t) holds {size} of the target's {full} "
            f"tokens ({size / full:.0%}; published heads keep >= 16%): every other token is "
            f"always rejected; {LOWER}",
            "Use a head whose draft vocabulary covers more of the target's tokens (32000 is typical).",
            file=_cfg(drafter),
            evidence={"draft_vocab": size, "target_tokens": full},
        )
    ]
