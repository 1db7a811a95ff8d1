"""The capacity search: doubling, halving, bisection, and the verdict following a slow arm.

The probes here come from a queue model of a server (an arm sustains a rate below its own
capacity): the search logic on known answers. The probes' measurement is the rate levels' own
(tests/tune/test_rates.py, real blocks on the demo pair).
"""

from __future__ import annotations

import math

import pytest

from spectool.errors import BadInputError
from spectool.tuning import capacity
from spectool.tuning.capacity import PRECISION, Search, search, sentence


def _server(deployed: float, baseline: float):
    """Probe of a server whose deployment sustains up to ``deployed`` req/s, its baseline up
    to ``baseline``."""

    def probe(rate: float, index: int) -> dict:
        return {
            "deployed": {"sustained": rate <= deployed},
            "baseline": {"sustained": rate <= baseline},
        }

    return probe


@pytest.mark.parametrize(("spec", "base"), [(7.0, 4.0), (4.0, 7.0), (0.3, 0.2), (50.0, 50.0)])
def test_the_search_brackets_each_arms_capacity(spec: float, base: float) -> None:
    state = search(1.0, _server(spec, base))
    for arm, cap in (("deployed", spec), ("baseline", base)):
        b = state.brackets[arm]
        assert b.lo <= cap < b.hi, (arm, b)
        assert b.hi <= b.lo * (1 + PRECISION) + 1e-9
    assert len(state.probes) <= capacity.MAX_PROBES


def test_a_slow_deployed_arm_turns_the_verdict() -> None:
    """The same server, its speculative arm injected slower: the sentence follows."""
    faster = search(2.0, _server(8.0, 5.0))
    slower = search(2.0, _server(3.0, 5.0))
    assert faster.brackets["deployed"].lo > faster.brackets["baseline"].hi
    assert slower.brackets["deployed"].hi < slower.brackets["baseline"].lo
    d, b = slower.brackets["deployed"], slower.brackets["baseline"]
    assert sentence(slower) == (
        f"With speculation this server sustains {d.lo:.3g} req/s (fails at {d.hi:.3g}) at the "
        f"SLO, without it {b.lo:.3g} req/s (fails at {b.hi:.3g})."
    )


def test_the_search_is_bounded() -> None:
    state = search(1.0, _server(math.inf, math.inf))  # never fails: stops at its ceiling
    assert state.brackets["deployed"].hi == math.inf
    assert "at least" in sentence(state)
    assert len(state.probes) == capacity.MAX_DOUBLINGS + 1
    none = search(1.0, _server(0.0, 0.0))  # never sustains: stops at its floor
    assert none.brackets["baseline"].lo == 0 and "less than" in sentence(none)
    with pytest.raises(BadInputError):
        search(0.0, _server(1.0, 1.0))


def test_the_search_replays_the_same_probes() -> None:
    """Deterministic given the probes' outcomes: a resumed run asks for the same rates."""
    a, b = search(1.5, _server(6.0, 2.5)), search(1.5, _server(6.0, 2.5))
    assert [p["rate_per_s"] for p in a.probes] == [p["rate_per_s"] for p in b.probes]
    assert isinstance(a, Search)
