"""Whether a head was trained for this target: its base model name against the target's identity."""

from __future__ import annotations

import re
from pathlib import Path

from spectool.ckpt.card import card_base_models
from spectool.ckpt.inspect import Checkpoint
from spectool.findings import Finding, error, warning

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


def _plain(name: str) -> str:
    """A model name without the ``meta-`` prefix meta-llama dropped when it renamed its repos
    (Meta-Llama-3.1-8B-Instruct -> Llama-3.1-8B-Instruct)."""
    return name.removeprefix("meta-")


def _matches(base: str, ids: set[str], names: set[str], *, lineage: bool) -> bool:
    """Whether a claimed base model is the target: its repo id or its name (``meta-`` aside).
    With ``lineage`` (a model card, whose ``base_model`` may name the pretrained model a
    fine-tune came from) a target whose name extends the base's (Llama-3.1-8B-Instruct from
    Llama-3.1-8B) matches too."""
    repo = base.split("@")[0]
    if _looks_like_repo_id(repo) and repo.lower() in ids:
        return True
    name = _plain(_last_name(base))
    plain_names = {_plain(n) for n in names}
    if name in plain_names:
        return True
    return lineage and any(n.startswith(name + "-") for n in plain_names)


def _looks_like_repo_id(ref: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+", ref))


def _last_name(ref: str) -> str:
    return ref.rstrip("/").split("/")[-1].split("@")[0].lower()


def _claimed_bases(drafter: Checkpoint) -> list[tuple[str, str]]:
    """(base model, the file that names it): config.json's ``base_model_name_or_path`` /
    ``base_model``, then the model card's ``base_model`` metadata (README.md front matter)."""
    claims: list[tuple[str, str]] = []
    if drafter.base_model:
        claims.append((drafter.base_model, str(drafter.path / "config.json")))
    claims += [(b, str(drafter.path / "README.md")) for b in card_base_models(drafter.path)]
    return claims


def base_model_rule(target: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    """The head's base model (config, else model card) against the target's identity, where known.

    A local copy of the base model (``/models/vicuna-7b-v1.3`` for ``lmsys/vicuna-7b-v1.3``)
    matches by name; a mismatch is an error only when the target's repo id is known, otherwise
    a warning, said once, that the identity could not be verified. A model card may list several
    base models (a fine-tune's lineage): any one matching is a match.

    Reported: a head trained for another target of the same architecture and sizes loads and
    verifies but accepts less (https://github.com/vllm-project/vllm/pull/6830: the Llama-3 EAGLE
    head and its target's lm_head; https://github.com/SafeAILab/EAGLE/issues/132: "incorrect
    draft model weights").
    """
    claims = _claimed_bases(drafter)
    if not claims:
        return []
    ids, names = _model_ids(target)
    for base, source in claims:
        if _matches(base, ids, names, lineage=source.endswith("README.md")):
            return []
    base, source = claims[0]
    from_card = source.endswith("README.md")
    at = f"{drafter.ref.rstrip('/')}/{Path(source).name}"
    evidence = {"drafter_base_model": base, "target_ids": sorted(ids)}
    if ids:
        # A model card's base_model is looser metadata than the config's field: a mismatch
        # read there is a warning, not an error.
        severity = warning if from_card else error
        return [
            severity(
                "BASE_MODEL_MISMATCH",
                f"{at} names base model {base!r}, target is {' / '.join(sorted(ids))}: "
                "acceptance will be lower than published (the head was trained on another "
                "model's hidden states)",
                "Use the head trained for this target (heads are tied to their base model's "
                "hidden states).",
                file=source,
                evidence=evidence,
            )
        ]
    return [
        warning(
            "BASE_MODEL_UNVERIFIED",
            f"{at} names base model {base!r}; the identity of target {target.ref} "
            "could not be verified (a local folder of another name, no _name_or_path); if it "
            "is another model, acceptance will be lower than published",
            "Make sure the target is that base model: heads are tied to their base model's "
            "hidden states. Naming the folder after the model silences this.",
            file=source,
            evidence=evidence,
        )
    ]
