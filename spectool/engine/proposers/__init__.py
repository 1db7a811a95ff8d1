"""Proposers: the registry ``method name -> ProposerSpec`` the engine builds its drafting from.

A new method is one module with a ``SPEC`` (:class:`~spectool.engine.proposers.base.ProposerSpec`)
added to :data:`PROPOSERS`; the engine, verification and the server need no change.
"""

from __future__ import annotations

from spectool.engine.proposers import draft_model, eagle3, mtp, ngram
from spectool.engine.proposers.base import Proposer, ProposerContext, ProposerSpec
from spectool.errors import ConfigError

PROPOSERS: dict[str, ProposerSpec] = {
    spec.name: spec for spec in (draft_model.SPEC, ngram.SPEC, eagle3.SPEC, mtp.SPEC)
}

__all__ = ["PROPOSERS", "Proposer", "ProposerContext", "ProposerSpec", "proposer_spec"]


def proposer_spec(method: str, has_checkpoint: bool) -> ProposerSpec | None:
    """The registry entry of ``method`` (None for ``"none"``); :class:`ConfigError` when a
    drafter checkpoint is missing for a method that runs one, or given to one that does not."""
    spec = PROPOSERS.get(method)
    if spec is not None and spec.needs_checkpoint and not has_checkpoint:
        raise ConfigError("engine config", f"method {method!r} needs a drafter checkpoint")
    if (spec is None or not spec.needs_checkpoint) and has_checkpoint:
        takes = sorted(name for name, s in PROPOSERS.items() if s.needs_checkpoint)
        raise ConfigError(
            "engine config",
            f"a drafter checkpoint is only used with method "
            f"{' or '.join(repr(n) for n in takes)}, not {method!r}",
        )
    return spec
