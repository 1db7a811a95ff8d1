"""Leviathan et al.'s constant-acceptance chain, in pure Python (no numpy): confirmed tokens per
step at a constant per-token acceptance ``alpha``, and the ``alpha`` that gives a measured
acceptance length. Shared by the decision (:mod:`spectool.decide.acceptance`) and the
prediction before renting (:mod:`spectool.predict.acceptance`), which imports no numpy."""

from __future__ import annotations

from spectool.errors import BadInputError


def leviathan_expected_tokens(alpha: float, k: int) -> float:
    """Leviathan et al.'s ``(1 - alpha^(k+1)) / (1 - alpha)`` for a constant ``alpha``."""
    if not 0.0 <= alpha <= 1.0 or k < 0:
        raise BadInputError("acceptance", f"need 0 <= alpha <= 1 and k >= 0, got {alpha}, {k}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def constant_alpha_for(tokens_per_step: float, k: int, where: str = "acceptance") -> float:
    """The constant ``alpha`` whose Leviathan form gives ``tokens_per_step`` at draft length ``k``.

    For engines that report only an acceptance length (TensorRT-LLM ``acceptanceLength``), or a
    published figure, this is the one-parameter stand-in for per-position acceptance. Solved by
    bisection: the form rises monotonically in ``alpha`` from 1 (at 0) to ``k + 1`` (at 1).
    ``where`` names the input in the error.
    """
    if k < 1 or not 1.0 <= tokens_per_step <= k + 1:
        raise BadInputError(
            where, f"tokens per step {tokens_per_step} outside [1, {k + 1}] for k={k}"
        )
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if leviathan_expected_tokens(mid, k) < tokens_per_step:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
