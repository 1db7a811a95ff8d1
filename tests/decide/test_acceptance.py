"""Per-position acceptance, E[tokens | k], Leviathan's form and TensorRT-LLM's acceptance length."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectool.decide.acceptance import (
    PositionCounts,
    acceptance_length,
    constant_alpha_for,
    draft_acceptance_rate,
    expected_tokens_per_step,
    expected_tokens_table,
    leviathan_expected_tokens,
)
from spectool.errors import BadInputError


@given(st.integers(0, 16))
def test_alpha_one_gives_k_plus_one_and_alpha_zero_gives_one(k: int) -> None:
    assert expected_tokens_per_step([1.0] * 16, k) == k + 1
    assert expected_tokens_per_step([0.0] * 16, k) == 1.0
    assert leviathan_expected_tokens(1.0, k) == k + 1
    assert leviathan_expected_tokens(0.0, k) == 1.0


@given(st.floats(0.0, 1.0), st.integers(0, 12))
def test_constant_alpha_equals_leviathan(alpha: float, k: int) -> None:
    assert expected_tokens_per_step([alpha] * 12, k) == pytest.approx(
        leviathan_expected_tokens(alpha, k), rel=1e-9
    )


@given(st.floats(0.0, 0.999), st.integers(1, 10))
def test_constant_alpha_for_inverts_leviathan(alpha: float, k: int) -> None:
    tokens = leviathan_expected_tokens(alpha, k)
    found = constant_alpha_for(tokens, k)
    assert leviathan_expected_tokens(found, k) == pytest.approx(tokens, rel=1e-9)


def test_from_vllm_counters_gives_conditional_alphas() -> None:
    # vLLM: 100 drafts of 3 tokens; position 1 accepted 80 times, 1-2 60 times, 1-3 30 times.
    counts = PositionCounts.from_vllm(100, [80, 60, 30])
    assert counts.reached_per_pos == (100, 80, 60)
    assert counts.alphas() == pytest.approx((0.8, 0.75, 0.5))
    # 1 + 0.8 + 0.8*0.75 + 0.8*0.75*0.5 = 2.7 = 1 + (80 + 60 + 30) / 100
    assert expected_tokens_per_step(counts.alphas(), 3) == pytest.approx(2.7)
    assert counts.mean_tokens_per_step() == pytest.approx(2.7)
    assert expected_tokens_table(counts.alphas()) == pytest.approx((1.0, 1.8, 2.4, 2.7))


def test_from_drafted_counts_what_the_engine_reports() -> None:
    # spectool's engine: every one of 100 drafts proposes 3 tokens; prefixes of 1/2/3 accepted
    # 80/60/30 times. Proposed counts are unconditional: (100, 100, 100).
    counts = PositionCounts.from_drafted([80, 60, 30], [100, 100, 100])
    assert counts == PositionCounts.from_vllm(100, [80, 60, 30])
    # Counts that are already conditional ("reached") pass through unchanged.
    assert PositionCounts.from_drafted([80, 60, 30], [100, 80, 60]) == counts
    with pytest.raises(BadInputError, match="drafted counts"):
        PositionCounts.from_drafted([1, 1], [2])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=2, max_size=9).filter(lambda h: sum(h) > 0))
def test_histogram_alphas_reproduce_the_measured_mean(hist: list[int]) -> None:
    counts = PositionCounts.from_histogram(hist)
    k = len(hist) - 1
    measured = 1 + sum(j * n for j, n in enumerate(hist)) / sum(hist)
    assert counts.steps == sum(hist)
    assert expected_tokens_per_step(counts.alphas(), k) == pytest.approx(measured)
    assert counts.mean_tokens_per_step() == pytest.approx(measured)


@settings(max_examples=30, deadline=None)
@given(
    alphas=st.lists(st.floats(0.05, 0.95), min_size=2, max_size=7),
    seed=st.integers(0, 2**32 - 1),
)
def test_alphas_at_k_predict_every_shorter_draft(alphas: list[float], seed: int) -> None:
    """Chain drafts: the same steps truncated to k' < K accept min(L, k') tokens."""
    big_k = len(alphas)
    rng = np.random.default_rng(seed)
    ok = rng.random((4000, big_k)) < np.array(alphas)
    leading = np.cumprod(ok, axis=1).sum(axis=1)
    counts = PositionCounts(
        tuple(int((leading >= i + 1).sum()) for i in range(big_k)),
        tuple(int((leading >= i).sum()) for i in range(big_k)),
    )
    table = expected_tokens_table(counts.alphas())
    for k in range(big_k + 1):
        assert table[k] == pytest.approx(1 + np.minimum(leading, k).mean())
    # ... and the estimates converge on the true alphas: within 5 binomial standard errors.
    for i, (est, true) in enumerate(zip(counts.alphas(), alphas, strict=True)):
        reached = counts.reached_per_pos[i]
        if reached >= 100:
            assert est == pytest.approx(true, abs=5 * (0.25 / reached) ** 0.5)


def test_trtllm_acceptance_length_pools_counts() -> None:
    # Two iterations: 4 requests accepting 8 tokens, then 1 request accepting 0.
    assert acceptance_length(8, 4) == pytest.approx(3.0)
    assert acceptance_length(0, 1) == pytest.approx(1.0)
    pooled = acceptance_length(8 + 0, 4 + 1)
    assert pooled == pytest.approx(13 / 5)
    assert pooled != pytest.approx((3.0 + 1.0) / 2)  # not the mean of per-iteration values
    assert acceptance_length(0, 0) is None


def test_draft_acceptance_rate() -> None:
    assert draft_acceptance_rate(30, 40) == pytest.approx(0.75)
    assert draft_acceptance_rate(0, 0) is None
    with pytest.raises(BadInputError):
        draft_acceptance_rate(5, 4)


def test_merged_pools_counts_across_draft_lengths() -> None:
    at_one = PositionCounts((70,), (100,))
    at_three = PositionCounts.from_vllm(100, [80, 60, 30])
    both = at_one.merged(at_three)
    assert both.accepted_per_pos == (150, 60, 30)
    assert both.reached_per_pos == (200, 80, 60)
    assert both.alphas()[0] == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("accepted", "reached", "problem"),
    [
        ((5,), (4,), "accepted but only"),
        ((5, 5), (10, 6), "reached 6 times"),
        ((1,), (1, 1), "reached counts"),
        ((-1,), (1,), ">= 0"),
    ],
)
def test_inconsistent_counts_are_rejected(accepted: tuple, reached: tuple, problem: str) -> None:
    with pytest.raises(BadInputError, match=problem):
        PositionCounts(accepted, reached)


def test_bad_alphas_and_lengths_are_rejected() -> None:
    with pytest.raises(BadInputError, match=r"\[0, 1\]"):
        expected_tokens_per_step([1.2], 1)
    with pytest.raises(BadInputError, match="draft length"):
        expected_tokens_per_step([0.5, 0.5], 3)
    with pytest.raises(BadInputError, match="outside"):
        constant_alpha_for(5.0, 3)


def test_unreached_position_contributes_nothing() -> None:
    counts = PositionCounts((0, 0), (10, 0))
    assert counts.alphas() == (0.0, 0.0)
    assert expected_tokens_per_step(counts.alphas(), 2) == 1.0
