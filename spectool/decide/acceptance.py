"""Per-position acceptance of chain speculation and the tokens a verify step confirms.

Positions are 1-based in formulas and 0-based in tuples. A verify step with draft length ``k``
proposes draft positions ``1..k``; the target accepts a prefix of them and always adds one token
of its own (the correction token after a rejection, or the bonus token when all ``k`` pass).

* ``alpha_i`` = P(position i accepted | positions 1..i-1 accepted and position i drafted)
  = ``accepted_per_pos[i] / reached_per_pos[i]`` (:class:`PositionCounts`).
* Confirmed tokens per step, the bonus/correction token included:
  ``E[tokens | k] = 1 + sum_{i<=k} prod_{j<=i} alpha_j`` (:func:`expected_tokens_per_step`).
  This is exact, not an independence assumption: ``prod_{j<=i} alpha_j`` is P(at least i accepted).
* Leviathan et al. (2023) closed form for a constant ``alpha``:
  ``E[tokens | k] = (1 - alpha^(k+1)) / (1 - alpha)`` (``k + 1`` at ``alpha = 1``).
* TensorRT-LLM ``specDecodingStats.acceptanceLength`` =
  ``(numAcceptedTokens + numRequestsWithDraftTokens) / numRequestsWithDraftTokens``: the mean of
  ``E[tokens | k]`` over request-steps that drafted. Sum the counts over iterations before
  dividing (:func:`acceptance_length`); averaging per-iteration values weights iterations, not
  steps.
* vLLM's per-position rate ``num_accepted_tokens_per_pos[i] / num_drafts`` is unconditional
  (P(first i+1 accepted)); :meth:`PositionCounts.from_vllm` turns it into conditional counts,
  as :meth:`PositionCounts.from_drafted` does for per-position proposed counts (spectool's
  engine, ``spectoolStats``).

Predicting shorter drafts from a measurement at ``K``: for a chain drafter the token proposed at
position ``i`` does not depend on how many positions follow, so ``alpha_1..alpha_k`` measured at
``K`` give ``E[tokens | k]`` for every ``k <= K`` (:func:`expected_tokens_table`). Tree drafters
break this; so does acceptance that drifts with batch size (TensorRT-LLM #9208).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# the constant-alpha chain lives in pure Python for spectool.predict; callers import it from here
from spectool.decide.chain import constant_alpha_for as constant_alpha_for
from spectool.decide.chain import leviathan_expected_tokens as leviathan_expected_tokens
from spectool.errors import BadInputError


@dataclass(frozen=True)
class PositionCounts:
    """Per-position acceptance counts of chain speculation, pooled over verify steps.

    ``reached_per_pos[i]``: steps that drafted position ``i+1`` with every earlier position
    accepted (for position 1: steps that drafted at all). ``accepted_per_pos[i]``: those of them
    in which position ``i+1`` was accepted too. Chain invariants, checked:
    ``accepted[i] <= reached[i]`` and ``reached[i+1] <= accepted[i]``.
    """

    accepted_per_pos: tuple[int, ...]
    reached_per_pos: tuple[int, ...]

    def __post_init__(self) -> None:
        acc = tuple(int(a) for a in self.accepted_per_pos)
        reach = tuple(int(r) for r in self.reached_per_pos)
        object.__setattr__(self, "accepted_per_pos", acc)
        object.__setattr__(self, "reached_per_pos", reach)
        where = "per-position acceptance counts"
        if len(acc) != len(reach):
            raise BadInputError(
                where, f"{len(acc)} accepted counts but {len(reach)} reached counts"
            )
        if any(a < 0 for a in acc) or any(r < 0 for r in reach):
            raise BadInputError(where, "counts must be >= 0")
        for i, (a, r) in enumerate(zip(acc, reach, strict=True)):
            if a > r:
                raise BadInputError(where, f"position {i + 1}: {a} accepted but only {r} reached")
            if i > 0 and r > acc[i - 1]:
                raise BadInputError(
                    where,
                    f"position {i + 1} reached {r} times but position {i} accepted only "
                    f"{acc[i - 1]} times",
                )

    @classmethod
    def from_vllm(cls, num_drafts: int, accepted_per_pos: Sequence[int]) -> PositionCounts:
        """From vLLM's counters ``spec_decode_num_drafts`` and ``..._num_accepted_tokens_per_pos``.

        vLLM drafts every position of every draft, so position 1 is reached ``num_drafts`` times
        and position ``i+1`` as often as position ``i`` was accepted.
        """
        acc = tuple(int(a) for a in accepted_per_pos)
        return cls(acc, (int(num_drafts), *acc[:-1]) if acc else ())

    @classmethod
    def from_drafted(
        cls, accepted_per_pos: Sequence[int], drafted_per_pos: Sequence[int]
    ) -> PositionCounts:
        """From per-position *proposed* counts (spectool's engine and ``spectoolStats``).

        ``drafted_per_pos[i]`` counts drafts that proposed a token at position ``i+1``, whether or
        not earlier positions were accepted. Position ``i+1`` is reached by
        ``min(drafted[i], accepted[i-1])`` drafts: exact when every draft has the same length
        (one cell of ``tune``), an upper bound (so ``alpha`` errs low) when lengths vary within
        the counts. Counts that are already conditional pass through unchanged.
        """
        acc = tuple(int(a) for a in accepted_per_pos)
        drafted = tuple(int(d) for d in drafted_per_pos)
        if len(acc) != len(drafted):
            raise BadInputError(
                "per-position acceptance counts",
                f"{len(acc)} accepted counts but {len(drafted)} drafted counts",
            )
        reached = tuple(d if i == 0 else min(d, acc[i - 1]) for i, d in enumerate(drafted))
        return cls(acc, reached)

    @classmethod
    def from_histogram(cls, steps_with_accepted: Sequence[int]) -> PositionCounts:
        """From an acceptance histogram: ``steps_with_accepted[j]`` steps accepted exactly ``j``
        draft tokens (vLLM ``acceptance_histogram``, length ``K + 1``)."""
        hist = np.asarray(steps_with_accepted, dtype=np.int64)
        if hist.ndim != 1 or hist.size < 1 or (hist < 0).any():
            raise BadInputError("acceptance histogram", "must be a non-empty list of counts >= 0")
        at_least = np.cumsum(hist[::-1])[::-1]  # at_least[j] = steps with >= j accepted
        return cls(tuple(at_least[1:].tolist()), tuple(at_least[:-1].tolist()))

    @property
    def max_draft_len(self) -> int:
        """Number of positions counted."""
        return len(self.accepted_per_pos)

    @property
    def steps(self) -> int:
        """Verify steps counted (those that reached position 1)."""
        return self.reached_per_pos[0] if self.reached_per_pos else 0

    def alphas(self) -> tuple[float, ...]:
        """Conditional acceptance ``alpha_i`` per position; 0.0 where a position was never reached.

        A never-reached position only matters when an earlier position was accepted, which the
        chain invariants rule out unless drafts were shorter than ``max_draft_len``.
        """
        return tuple(
            a / r if r else 0.0
            for a, r in zip(self.accepted_per_pos, self.reached_per_pos, strict=True)
        )

    def mean_tokens_per_step(self) -> float | None:
        """Measured confirmed tokens per verify step: ``1 + sum(accepted) / steps``."""
        if not self.steps:
            return None
        return 1.0 + sum(self.accepted_per_pos) / self.steps

    def merged(self, other: PositionCounts) -> PositionCounts:
        """Pool two sets of counts (positions beyond the shorter one come from the longer)."""
        n = max(self.max_draft_len, other.max_draft_len)

        def pad(t: tuple[int, ...]) -> list[int]:
            return list(t) + [0] * (n - len(t))

        acc = [
            a + b
            for a, b in zip(pad(self.accepted_per_pos), pad(other.accepted_per_pos), strict=True)
        ]
        reach = [
            a + b
            for a, b in zip(pad(self.reached_per_pos), pad(other.reached_per_pos), strict=True)
        ]
        return PositionCounts(tuple(acc), tuple(reach))


def _check_alphas(alphas: Sequence[float], k: int) -> np.ndarray:
    arr = np.asarray(alphas, dtype=float)
    if arr.ndim != 1 or not np.all((arr >= 0.0) & (arr <= 1.0)):
        raise BadInputError("acceptance", f"alphas must lie in [0, 1], got {list(alphas)}")
    if not 0 <= k <= arr.size:
        raise BadInputError("acceptance", f"draft length {k} needs 0 <= k <= {arr.size} alphas")
    return arr


def expected_tokens_per_step(alphas: Sequence[float], k: int) -> float:
    """``E[tokens | k] = 1 + sum_{i<=k} prod_{j<=i} alpha_j``: confirmed tokens per verify step."""
    arr = _check_alphas(alphas, k)
    return float(1.0 + np.cumprod(arr[:k]).sum())


def expected_tokens_table(alphas: Sequence[float]) -> tuple[float, ...]:
    """``E[tokens | k]`` for every ``k = 0..len(alphas)`` (index ``k``); index 0 is 1.0."""
    arr = _check_alphas(alphas, 0)
    return tuple((1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(arr))])).tolist())


def acceptance_length(accepted_tokens: int, requests_with_draft: int) -> float | None:
    """TensorRT-LLM's ``(accepted + requests_with_draft) / requests_with_draft``; None if no draft.

    Pass sums over iterations of ``numAcceptedTokens`` and ``numRequestsWithDraftTokens``.
    """
    if accepted_tokens < 0 or requests_with_draft < 0:
        raise BadInputError("acceptance", "counts must be >= 0")
    if requests_with_draft == 0:
        return None
    return (accepted_tokens + requests_with_draft) / requests_with_draft


def draft_acceptance_rate(accepted_tokens: int, draft_tokens: int) -> float | None:
    """Accepted draft tokens over proposed draft tokens (bonus excluded); None with no drafts."""
    if accepted_tokens < 0 or draft_tokens < 0 or accepted_tokens > draft_tokens:
        raise BadInputError("acceptance", "need 0 <= accepted <= drafted")
    return None if draft_tokens == 0 else accepted_tokens / draft_tokens
