"""Acceptance as the step-cost model takes it: conditional per-position ``alpha_i``, pure Python.

Best first: per-position counts measured by ``tune`` (:meth:`Acceptance.from_counts`, anything
with ``alphas()`` such as :class:`spectool.decide.acceptance.PositionCounts`), valid for every
``k`` up to the measured one; an acceptance length measured at some ``k`` or a per-draft-token
acceptance rate (:meth:`from_length`, :meth:`from_rate`: one constant ``alpha``, Leviathan et
al. 2023, extrapolated to any ``k``); a published figure (same, with its source). The formulas
are those of :mod:`spectool.decide.acceptance`, restated without numpy so predicting stays light.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from spectool.decide.chain import constant_alpha_for, leviathan_expected_tokens
from spectool.errors import BadInputError


class _HasAlphas(Protocol):
    def alphas(self) -> tuple[float, ...]: ...


@dataclass(frozen=True)
class Acceptance:
    """Conditional acceptance per draft position, and where it came from.

    ``alphas[i]``: P(position i+1 accepted | positions 1..i accepted). ``extrapolates``: True
    for a constant ``alpha`` (any ``k`` may be predicted), False for measured positions (only
    ``k <= len(alphas)``). ``source``: a phrase for reports ("tune run, 4 positions",
    "published: <url>").
    """

    alphas: tuple[float, ...]
    source: str
    extrapolates: bool = False

    def __post_init__(self) -> None:
        if not self.alphas or any(not 0.0 <= a <= 1.0 for a in self.alphas):
            raise BadInputError("acceptance", f"alphas must lie in [0, 1], got {self.alphas}")

    @classmethod
    def from_alphas(cls, alphas: Sequence[float], source: str) -> Acceptance:
        return cls(tuple(float(a) for a in alphas), source)

    @classmethod
    def from_counts(cls, counts: _HasAlphas, source: str = "measured per position") -> Acceptance:
        """From measured per-position counts (``PositionCounts`` or anything with ``alphas()``)."""
        return cls(tuple(counts.alphas()), source)

    @classmethod
    def from_length(cls, length: float, k: int, source: str) -> Acceptance:
        """From an acceptance length (tokens per step, bonus included) measured at draft length
        ``k``: the constant ``alpha`` that reproduces it."""
        return cls((constant_alpha_for(length, k, source),), source, extrapolates=True)

    @classmethod
    def from_rate(cls, rate: float, source: str) -> Acceptance:
        """From a per-draft-token acceptance rate, read as a constant ``alpha``."""
        if not 0.0 <= rate <= 1.0:
            raise BadInputError(source, f"acceptance rate {rate} is outside [0, 1]")
        return cls((float(rate),), source, extrapolates=True)

    @property
    def max_k(self) -> int | None:
        """The largest draft length this acceptance predicts (None: any)."""
        return None if self.extrapolates else len(self.alphas)

    def all_accepted(self, k: int) -> float:
        """P(all ``k`` drafts of a step accepted) = ``prod_{i<=k} alpha_i``."""
        if self.extrapolates:
            return self.alphas[0] ** k
        run = 1.0
        for a in self.alphas[:k]:
            run *= a
        return run

    def tokens_per_step(self, k: int) -> float | None:
        """``E[tokens | k] = 1 + sum_{i<=k} prod_{j<=i} alpha_j``; None beyond what was measured."""
        if k < 0:
            raise BadInputError("acceptance", f"draft length {k} < 0")
        if self.extrapolates:
            return leviathan_expected_tokens(self.alphas[0], k)
        if k > len(self.alphas):
            return None
        total, run = 1.0, 1.0
        for a in self.alphas[:k]:
            run *= a
            total += run
        return total
