"""Rules for a standalone draft model: one token space with the target, and much cheaper."""

from __future__ import annotations

from spectool.ckpt.inspect import Checkpoint
from spectool.ckpt.tokenizer import compare_vocabularies
from spectool.findings import Finding, error, info, warning


def vocab_size_rule(
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


def token_space_rules(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
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
                    file=str(d_tok.path),
                    evidence={"target_tokens": t_tok.size, "drafter_tokens": d_tok.size},
                )
            )
        elif cmp.relation == "drafter_superset":
            findings.append(
                warning(
                    "TOKENIZER_SUPERSET",
                    f"the drafter's tokenizer has {cmp.only_drafter} tokens the target lacks "
                    f"(target {t_tok.size}, drafter {d_tok.size}; shared ids agree)",
                    "Drafts of those ids are always rejected; harmless if rare.",
                    file=str(d_tok.path),
                    evidence={"target_tokens": t_tok.size, "drafter_tokens": d_tok.size},
                )
            )
        if target.vocab_size and drafter.vocab_size and target.vocab_size != drafter.vocab_size:
            findings.append(
                warning(
                    "PADDED_VOCAB_DIFFERS",
                    f"same tokenizer but embedding rows padded differently: target vocab_size "
                    f"{target.vocab_size}, drafter {drafter.vocab_size}",
                    "TensorRT-LLM and spectool handle this; vLLM refuses such pairs.",
                    file=str(drafter.path / "config.json"),
                    evidence={
                        "target_vocab_size": target.vocab_size,
                        "drafter_vocab_size": drafter.vocab_size,
                    },
                )
            )
        findings += _special_token_rule(target, drafter)
        return findings
    findings += vocab_size_rule(target, drafter, drafter.vocab_size, "vocab_size")
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
                file=str(drafter.path / _eos_file(drafter)),
                evidence={"target_eos": sorted(t_eos), "drafter_eos": sorted(d_eos)},
            )
        ]
    return []


def _eos_file(ckpt: Checkpoint) -> str:
    """The file the EOS ids were read from (Checkpoint.eos_token_ids: generation config first)."""
    return "generation_config.json" if "eos_token_id" in ckpt.generation_config else "config.json"


def cost_rule(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
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
            file=str(drafter.path / "config.json"),
            evidence={
                "target_layers": t_layers,
                "drafter_layers": d_layers,
                "target_parameters": t_params,
                "drafter_parameters": d_params,
            },
        )
    ]


def _layers(n: int | None) -> str:
    return "? layers" if n is None else f"{n} layer{'' if n == 1 else 's'}"


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)
