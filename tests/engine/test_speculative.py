"""Proposers and verification: n-gram lookup, greedy acceptance, exact speculative sampling.

The sampling tests simulate a language model as a table of random distributions over a tiny
vocabulary (one per context), draft chains of two tokens from a deliberately different table,
and check with chi-square tests that the first one and two emitted tokens follow the target
exactly, while draws from the drafter alone fail the same test.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch  # noqa: TID253 (engine tests use torch throughout)

from spectool.engine.sampling import RowSampling, SamplingParams, process_logits, sample
from spectool.engine.speculative import propose_ngram, verify_greedy, verify_sampled

from .helpers import chi_square_pvalue

VOCAB = 8
DRAWS = 6000
ALPHA = 1e-3


@pytest.mark.parametrize(
    ("context", "k", "max_matching", "expected"),
    [
        ([1, 2, 3, 4, 2, 3], 4, 3, [4, 2, 3]),  # the docstring example
        ([1, 2, 3, 4, 2, 3], 1, 3, [4]),
        ([5, 6, 7, 5, 6, 8, 5, 6], 2, 2, [7, 5]),  # earliest match of [5, 6]
        ([5, 6, 7, 9, 6, 8, 5, 6], 2, 3, [7, 9]),  # [8, 5, 6] absent, [5, 6] found
        ([1, 2, 3], 3, 3, []),  # nothing repeats
        ([7, 7, 7, 7], 3, 2, [7, 7]),  # overlapping occurrence
        ([4], 3, 3, []),
        ([1, 2, 1, 2], 0, 3, []),
    ],
)
def test_propose_ngram(context: list[int], k: int, max_matching: int, expected: list[int]) -> None:
    assert propose_ngram(context, k, max_matching) == expected


def test_verify_greedy() -> None:
    full = verify_greedy([4, 5, 6], [4, 5, 6, 9])
    assert (full.num_accepted, full.token_ids, full.bonus) == (3, (4, 5, 6, 9), True)
    partial = verify_greedy([4, 5, 6], [4, 7, 6, 9])
    assert (partial.num_accepted, partial.token_ids, partial.bonus) == (1, (4, 7), False)
    none = verify_greedy([], [3])
    assert (none.num_accepted, none.token_ids, none.bonus) == (0, (3,), True)


def _model(salt: int, params: SamplingParams) -> Callable[[tuple[int, ...]], torch.Tensor]:
    """A random "language model": context -> processed probabilities [V], fixed per context.

    Logits are 1.5 x standard normal, seeded by (salt, context), then processed by the engine's
    own :func:`process_logits` (the same function the engine applies to p and q).
    """
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def probs(context: tuple[int, ...]) -> torch.Tensor:
        if context not in cache:
            seed = hash((salt, context)) % (2**31)
            logits = 1.5 * torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed))
            cache[context] = process_logits(logits.view(1, 1, -1), [RowSampling(params, None)])[
                0, 0
            ]
        return cache[context]

    return probs


def _exact_joint(model: Callable) -> torch.Tensor:
    """P(x1, x2) = p(x1) p(x2 | x1), shape [V, V]."""
    first = model(())
    return torch.stack([first[a] * model((a,)) for a in range(VOCAB)])


def _speculate(
    target: Callable, draft: Callable | None, generator: torch.Generator, k: int = 2
) -> tuple[int, int]:
    """Emit tokens by speculative rounds of k drafts until two exist; return them."""
    out: list[int] = []
    while len(out) < 2:
        drafts: list[int] = []
        q_rows: list[torch.Tensor] = []
        for i in range(k):
            context = tuple(out + drafts)
            if draft is None:  # deterministic proposal, like an n-gram match
                drafts.append((3 + 2 * len(out) + i) % VOCAB)
            else:
                q = draft(context)
                q_rows.append(q)
                drafts.append(sample(q, generator))
        p_rows = [target(tuple(out + drafts[:i])) for i in range(k + 1)]
        verdict = verify_sampled(
            drafts, torch.stack(q_rows) if q_rows else None, torch.stack(p_rows), generator
        )
        assert len(verdict.token_ids) == verdict.num_accepted + 1
        out.extend(verdict.token_ids)
    return out[0], out[1]


def _assert_target_distribution(pairs: list[tuple[int, int]], joint: torch.Tensor) -> None:
    counts = torch.zeros(VOCAB, VOCAB)
    for a, b in pairs:
        counts[a, b] += 1
    p_first = chi_square_pvalue(counts.sum(1), joint.sum(1))
    p_joint = chi_square_pvalue(counts, joint)
    assert p_first > ALPHA, p_first
    assert p_joint > ALPHA, p_joint


SAMPLING_CASES = {
    "temperature-1": SamplingParams(temperature=1.0),
    "temperature-top-k-top-p": SamplingParams(temperature=0.8, top_k=5, top_p=0.85),
}


@pytest.mark.parametrize("case", list(SAMPLING_CASES))
def test_speculative_sampling_matches_target(case: str) -> None:
    params = SAMPLING_CASES[case]
    target, draft = _model(1, params), _model(2, params)
    joint = _exact_joint(target)
    drafter_joint = _exact_joint(draft)
    assert (joint - drafter_joint).abs().sum() > 0.5  # the drafter really is unlike the target
    generator = torch.Generator().manual_seed(1234)
    pairs = [_speculate(target, draft, generator) for _ in range(DRAWS)]
    _assert_target_distribution(pairs, joint)

    # Control: the same test rejects draws from the drafter alone.
    flat = torch.multinomial(drafter_joint.flatten(), DRAWS, replacement=True, generator=generator)
    counts = torch.bincount(flat, minlength=VOCAB * VOCAB).view(VOCAB, VOCAB)
    assert chi_square_pvalue(counts, joint) < ALPHA
    assert chi_square_pvalue(counts.sum(1), joint.sum(1)) < ALPHA


def test_deterministic_drafts_match_target() -> None:
    """n-gram style proposals (q = one-hot) go through the same rule."""
    params = SamplingParams(temperature=1.0)
    target = _model(3, params)
    joint = _exact_joint(target)
    generator = torch.Generator().manual_seed(99)
    pairs = [_speculate(target, None, generator) for _ in range(DRAWS)]
    _assert_target_distribution(pairs, joint)


def test_seeded_generator_reproduces_draws() -> None:
    params = SamplingParams(temperature=1.0)
    target, draft = _model(1, params), _model(2, params)
    runs = []
    for _ in range(2):
        generator = torch.Generator().manual_seed(7)
        runs.append([_speculate(target, draft, generator) for _ in range(50)])
    assert runs[0] == runs[1]
    assert len(set(runs[0])) > 5
