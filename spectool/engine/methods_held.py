"""The drafters one engine holds, and switching between them in place.

An engine normally drafts with one method. Given alternatives (``Engine(..., alternatives=
{method: drafter folder or None})``) it builds every method's proposer beside its own and
drafts with one at a time; :meth:`MethodSwitching.set_method` changes which, only while no
request is queued or running, so every proposer's cache holds either every request or none.
This is what lets ``tune`` measure several methods' cells together on one server
(:mod:`spectool.tuning.joint`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from spectool.engine.config import EngineBusyError
from spectool.engine.proposers import Proposer, ProposerContext, proposer_spec
from spectool.errors import BadInputError


def check_methods(methods: Mapping[str, Path | None]) -> None:
    """Refuse a set of methods no engine can hold (``none`` beside others, a drafter missing
    or given where the method takes none)."""
    if "none" in methods and len(methods) > 1:
        raise BadInputError("engine config", "method 'none' cannot be an alternative")
    for method, path in methods.items():
        proposer_spec(method, has_checkpoint=path is not None)


def build_proposers(
    methods: Mapping[str, Path | None], context: Callable[[Path | None], ProposerContext]
) -> dict[str, Proposer]:
    """Each method's proposer (``none`` has none), built from ``context(drafter folder)``."""
    built: dict[str, Proposer] = {}
    for method, path in methods.items():
        spec = proposer_spec(method, has_checkpoint=path is not None)
        if spec is not None:
            built[method] = spec.factory(context(path))
    return built


class MethodSwitching:
    """The engine's side of holding several methods: which one drafts, and the switch."""

    config: Any
    _proposers: dict[str, Proposer]
    _lock: threading.Lock
    _queue: Any
    _running: Any

    @property
    def method(self) -> str:
        """The method drafting now (the configured one, or one chosen by :meth:`set_method`)."""
        return self._method

    @property
    def methods(self) -> tuple[str, ...]:
        """Every method this engine can draft with (its configured one first)."""
        return tuple(self._proposers) or (self.config.method,)

    def _use(self, method: str) -> None:
        self._method = method
        self._proposer: Proposer | None = self._proposers.get(method)
        # The drafter's network, where the proposer runs one (benchmarks read its weights).
        self.drafter: Any = getattr(self._proposer, "model", None)
        # Target layers whose outputs the proposer reads (EAGLE-3): captured in prefill/verify.
        self._hidden_layers: tuple[int, ...] = (
            tuple(self._proposer.hidden_layers) if self._proposer is not None else ()
        )

    def set_method(self, method: str) -> None:
        """Draft with ``method`` (one of :attr:`methods`) from now on. Only while idle: every
        proposer's cache holds no request then, so the next requests start on the new one."""
        if method not in self._proposers:
            raise BadInputError(
                "method", f"{method!r} is not loaded (this engine has {', '.join(self.methods)})"
            )
        with self._lock:
            if self._queue or self._running:
                raise EngineBusyError(
                    "method",
                    f"cannot change while {len(self._queue) + len(self._running)} requests run",
                )
            self._use(method)
