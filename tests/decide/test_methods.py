"""Comparing methods: the winner per concurrency, one method to deploy, pruning by a rival."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from spectool.decide.duel import DuelEstimate
from spectool.decide.methods import choose_method, method_cells, rival_ratios
from spectool.decide.search import initial_plan
from spectool.decide.tune import tune
from spectool.errors import BadInputError

from .world import World

CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64)
K = 6
# A strong drafter (high acceptance) and a weak one on the same serving costs.
STRONG = World(alphas=(0.9, 0.8, 0.7, 0.6, 0.5, 0.4))
WEAK = World(alphas=(0.5, 0.35, 0.25, 0.15, 0.1, 0.05), seed=3)


class Recorder:
    def __init__(self, world: World) -> None:
        self.world = world
        self.calls: list[tuple[int, int]] = []

    def __call__(self, c: int, k: int):  # noqa: ANN204
        self.calls.append((c, k))
        return self.world.measure(c, k)


def _run(world: World, method: str, rival=None):  # noqa: ANN001, ANN202
    recorder = Recorder(world)
    result = tune(CONCURRENCIES, K, recorder, n_boot=300, method=method, rival=rival)
    return result, recorder


def test_the_stronger_method_wins_where_it_pays_and_is_deployed() -> None:
    strong, _ = _run(STRONG, "eagle3")
    weak, _ = _run(WEAK, "draft_model")
    choice = choose_method([weak, strong])
    assert choice.chosen == "eagle3"
    assert choice.tied == ("eagle3",)
    cells = method_cells(strong)
    for c in CONCURRENCIES:
        if cells[c].k > 0:
            assert choice.winners[c] == "eagle3" or choice.cells["draft_model"][c].ratio < (
                cells[c].ratio
            )
    # The score is the geometric mean over concurrencies with off = 1.0.
    score = {s.method: s for s in choice.scores}
    assert score["eagle3"].mean_ratio < score["draft_model"].mean_ratio <= 1.0
    assert "eagle3" in choice.why and "draft_model" in choice.why
    decision = json.loads(json.dumps(choice.to_json()))
    assert decision["chosen"] == "eagle3"
    assert [row["concurrency"] for row in decision["per_concurrency"]] == list(CONCURRENCIES)
    assert set(decision["per_concurrency"][0]["methods"]) == {"eagle3", "draft_model"}


def test_equal_methods_tie_and_the_cheaper_one_is_deployed_every_time() -> None:
    # The same drafter quality measured twice with different noise: not distinguishable, so the
    # first in the caller's order (the cheaper to serve) wins whichever measured faster. Proving
    # equivalence within 5% at every concurrency where they speculate needs cells of about +-2%
    # (1200 steps); at 300 steps concurrency 1's +-4% intervals leave the tie unproven.
    precise = replace(STRONG, steps=1200)
    a, _ = _run(precise, "eagle3")
    b, _ = _run(replace(precise, seed=11), "draft_model")
    for order in ([a, b], [b, a]):
        choice = choose_method(order)
        assert set(choice.tied) == {"eagle3", "draft_model"}
        assert choice.chosen == order[0].method
        assert "proven equivalent" in choice.why and choice.certain


def test_a_rival_prunes_the_cells_predicted_to_lose() -> None:
    strong, _ = _run(STRONG, "eagle3")
    alone, alone_calls = _run(WEAK, "draft_model")
    pruned, pruned_calls = _run(WEAK, "draft_model", rival=rival_ratios([strong]))
    assert len(pruned_calls.calls) < len(alone_calls.calls)
    assert any("rival" in note for note in pruned.notes)
    # The planned cells are the same either way: the prune acts on confirmation only.
    planned = len(initial_plan(CONCURRENCIES, K))
    assert pruned_calls.calls[:planned] == alone_calls.calls[:planned]
    # The comparison still deploys the stronger method.
    assert choose_method([pruned, strong]).chosen == "eagle3"


def test_no_method_pays_deploys_the_baseline() -> None:
    hopeless = World(alphas=(0.05, 0.01, 0.0, 0.0, 0.0, 0.0))
    a, _ = _run(hopeless, "ngram")
    b, _ = _run(replace(hopeless, seed=5), "draft_model")
    choice = choose_method([a, b])
    assert all(w == "none" for w in choice.winners.values())
    assert "baseline" in choice.why


def test_bad_comparisons_are_refused() -> None:
    a, _ = _run(STRONG, "eagle3")
    with pytest.raises(BadInputError):
        choose_method([])
    with pytest.raises(BadInputError):
        choose_method([a, a])


def test_off_cells_say_whether_they_were_measured_or_only_predicted() -> None:
    strong, _ = _run(STRONG, "eagle3")
    weak, _ = _run(WEAK, "draft_model", rival=rival_ratios([strong]))
    cells = method_cells(weak)
    measured_concs = {v.concurrency for v in weak.cells}
    for c, cell in cells.items():
        if cell.k == 0:
            assert cell.measured == (c in measured_concs)
    assert any(cell.k == 0 and not cell.measured for cell in cells.values())


def test_wide_intervals_alone_do_not_tie_a_clearly_slower_method() -> None:
    def widened(result):  # noqa: ANN001, ANN202
        cells = tuple(replace(v, ci_low=v.ratio * 0.2, ci_high=v.ratio * 5.0) for v in result.cells)
        return replace(result, cells=cells)

    strong, _ = _run(STRONG, "eagle3")
    weak, _ = _run(WEAK, "ngram")
    results = [widened(weak), widened(strong)]  # ngram first: the cheaper to serve
    score = {s.method: s.mean_ratio for s in choose_method(results).scores}
    assert score["ngram"] > score["eagle3"] * 1.05
    # The intervals alone would tie them (and hand it to the cheaper ngram) ...
    assert choose_method(results, tie_margin=1e9).chosen == "ngram"
    # ... but a method more than 5% slower is not a tie.
    assert choose_method(results).chosen == "eagle3"


def _scaled(result, method: str, factor: float, width: float):  # noqa: ANN202
    """``result`` as another method whose ratios are ``factor`` times as large, each cell's
    interval ``width`` times its ratio either way."""
    cells = tuple(
        replace(
            v,
            ratio=v.ratio * factor,
            ci_low=v.ratio * factor / width,
            ci_high=v.ratio * factor * width,
        )
        for v in result.cells
    )
    return replace(result, method=method, cells=cells)


def test_wide_intervals_do_not_prove_a_tie_the_better_estimate_is_deployed_as_uncertain() -> None:
    """The issue's case: ngram 1.2% slower than the draft model by the estimates, each cell's
    interval about 0.5x-2x wide. Read as a tie, the cheaper ngram was deployed; unproven, the
    better estimate is, and the choice says it is uncertain and by how much."""
    base, _ = _run(STRONG, "draft_model")
    ngram = _scaled(base, "ngram", 1.012, 1.9)
    draft = _scaled(base, "draft_model", 1.0, 1.9)
    choice = choose_method([ngram, draft])  # ngram first: the cheaper to serve
    assert choice.chosen == "draft_model" and choice.tied == ("draft_model",)
    assert choice.uncertain == ("ngram",) and not choice.certain
    assert "UNCERTAIN" in choice.why
    scores = {s.method: s for s in choice.scores}
    assert scores["ngram"].standing == "uncertain"
    assert scores["ngram"].vs_best_low < 1 / 1.05 and scores["ngram"].vs_best_high > 1.05
    data = json.loads(json.dumps(choice.to_json()))
    assert data["uncertain"] == ["ngram"] and data["scores"]["ngram"]["standing"] == "uncertain"
    # narrow intervals prove the same 1.2% a tie: the cheaper method is deployed
    tight = choose_method(
        [_scaled(base, "ngram", 1.012, 1.02), _scaled(base, "draft_model", 1.0, 1.02)]
    )
    assert tight.chosen == "ngram" and set(tight.tied) == {"ngram", "draft_model"}
    assert tight.certain
    # and a 20% gap with narrow intervals is proven worse
    worse = choose_method(
        [_scaled(base, "ngram", 1.2, 1.02), _scaled(base, "draft_model", 1.0, 1.02)]
    )
    assert worse.chosen == "draft_model" and worse.certain
    assert {s.method: s.standing for s in worse.scores}["ngram"] == "worse"


def test_a_tie_must_hold_where_they_speculate_not_only_on_the_diluted_mean() -> None:
    """Speculation pays at concurrency 1 only; the draft model is 5.6% ahead there, measured
    head to head with a 4% standard error (the code workload's run, 2026-12-04). On the score
    over 1, 4 and 16 (both off at 4 and 16) that is 1.8%, "within 5%"; at concurrency 1 it is
    not proven: the tie is uncertain and the better estimate is deployed, not the cheaper."""
    base = tune((1, 4, 16), 4, STRONG.measure, n_boot=100, method="draft_model")
    results = []
    for method, k, ratio, low, high in (
        ("eagle3", 2, 0.808, 0.712, 0.916),  # first: the cheaper to serve
        ("draft_model", 4, 0.720, 0.612, 0.847),
    ):
        one = next(v for v in base.cells if v.concurrency == 1)
        cells = (replace(one, k=k, ratio=ratio, ci_low=low, ci_high=high),)
        results.append(replace(base, method=method, cells=cells, choices={1: k, 4: 0, 16: 0}))
    head = DuelEstimate(1, ("draft_model", "eagle3"), (4, 2), 0.947, 0.0395, (0.0,) * 24)
    diluted = choose_method(results, duel=[head], tie_margin=0.05)
    assert diluted.chosen == "draft_model" and not diluted.certain
    assert diluted.uncertain == ("eagle3",)
    scores = {s.method: s for s in diluted.scores}
    assert 0.95 < scores["eagle3"].vs_best_low and scores["eagle3"].vs_best_high < 1.05
