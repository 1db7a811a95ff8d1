"""benchmarks/spec_bound.py prices a speculative run against E / (1 + k c), per paired round;
gpu_check.py prints the same figures on a GPU, so the arithmetic is checked here."""

from __future__ import annotations

import pytest
from bench_support import load_benchmark

spec_bound = load_benchmark("spec_bound.py")


def run(tokens: float, seconds: float, steps: float, verify_ms: float, **more: float) -> dict:
    out = {"tokens": tokens, "seconds": seconds, "steps": steps, "verify_ms": verify_ms}
    out |= {"draft_ms": 0.0, "drafts": 0.0, "accepted": 0.0, "coord_ms": 0.0, "iter_ms": 0.0}
    return out | more


def test_a_round_at_its_bound_is_efficiency_one() -> None:
    """Baseline: 100 tokens in 100 steps of 1 ms. Speculative, k=4: 100 steps confirm 300
    tokens, each step drafts 4 tokens at 0.1 ms (c = 0.1) and verifies in 1 ms (v = 1):
    the bound is 3 / 1.4, met exactly when the run takes 140 ms."""
    base = run(100, 0.1, 100, 100.0)
    spec = run(300, 0.14, 100, 100.0, draft_ms=40.0, drafts=400.0)
    b = spec_bound.bound_of([base], [spec], 4)
    assert b.e == [3.0]
    assert b.c == [pytest.approx(0.1)]
    assert b.bound == [pytest.approx(3 / 1.4)]
    assert b.efficiency == [pytest.approx(1.0)]
    assert b.v == [pytest.approx(1.0)]
    assert b.parts[0] == pytest.approx((0.4, 1.0, 0.0, 0.0))


def test_a_dear_verify_pass_lowers_efficiency_but_not_against_its_own_cost() -> None:
    """The same run with a verify pass of 2 baseline forwards (and the time it adds): against
    E / (1 + k c) it reaches 1.4 / 2.4 of the bound; priced at its cost v it is met."""
    base = run(100, 0.1, 100, 100.0)
    spec = run(300, 0.24, 100, 200.0, draft_ms=40.0, drafts=400.0)
    b = spec_bound.bound_of([base], [spec], 4)
    assert b.v == [pytest.approx(2.0)]
    assert b.efficiency == [pytest.approx(1.4 / 2.4)]
    assert b.efficiency_v == [pytest.approx(1.0)]
    assert b.median("efficiency") == pytest.approx(1.4 / 2.4)


def test_rounds_pair_with_the_baseline_round_beside_them() -> None:
    """Each speculative round is priced against its own baseline round: a machine twice as
    slow in round 2 leaves the efficiency where it was."""
    fast, slow = run(100, 0.1, 100, 100.0), run(100, 0.2, 100, 200.0)
    spec_fast = run(300, 0.14, 100, 100.0, draft_ms=40.0, drafts=400.0)
    spec_slow = run(300, 0.28, 100, 200.0, draft_ms=80.0, drafts=400.0)
    b = spec_bound.bound_of([fast, slow], [spec_fast, spec_slow], 4)
    assert b.efficiency == [pytest.approx(1.0), pytest.approx(1.0)]
    with pytest.raises(ValueError, match="longer"):
        spec_bound.bound_of([fast], [spec_fast, spec_slow], 4)
