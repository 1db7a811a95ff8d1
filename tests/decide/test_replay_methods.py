"""Replaying tune's method comparison on method grids, judged against the other rounds."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from spectool.decide.replay_methods import replay_methods, rounds_from_grids
from spectool.errors import BadInputError
from spectool.measure.grids import read_grids

from .world import World

CONCS = (1, 4, 16)
K = 4
STRONG = World(alphas=(0.9, 0.8, 0.7, 0.6, 0.5, 0.4), with_records=True, steps=120)
WEAK = World(alphas=(0.5, 0.35, 0.25, 0.15, 0.1, 0.05), with_records=True, steps=120)


def _round(seed: int) -> dict[str, dict]:
    strong, weak = replace(STRONG, seed=seed), replace(WEAK, seed=seed + 100)
    grids = {
        "draft_model": {(c, k): weak.measure(c, k) for c in CONCS for k in range(1, K + 1)},
        "eagle3": {(c, k): strong.measure(c, k) for c in CONCS for k in range(1, K + 1)},
    }
    for c in CONCS:  # one baseline per round, shared by every method
        base = strong.measure(c, 0)
        for grid in grids.values():
            grid[(c, 0)] = base
    return grids


def test_the_replayed_comparison_deploys_the_stronger_method_near_the_best() -> None:
    rounds = [_round(seed) for seed in range(3)]
    replays = replay_methods(rounds, ["r0", "r1", "r2"], ["draft_model", "eagle3"], n_boot=100)
    for replay in replays:
        assert replay.chosen == "eagle3"
        assert replay.quality and replay.verdicts and replay.worst_share >= 0.95
        assert all(row["best"].startswith("eagle3") for row in replay.rows)
        # the later method's search reads the earlier one's ratios as its rival: fewer cells
        assert replay.cells_measured < replay.cells_in_round
    # the weak method deployed instead would be judged short of the best
    weak_only = replay_methods(rounds, ["r0", "r1", "r2"], ["draft_model"], n_boot=100)
    assert all(r.chosen == "draft_model" and r.worst_share < 0.95 for r in weak_only)


def test_rounds_that_do_not_hold_every_method_are_refused() -> None:
    rounds = [_round(0), _round(1)]
    with pytest.raises(BadInputError):
        replay_methods(rounds[:1], ["r0"], ["draft_model", "eagle3"])
    with pytest.raises(BadInputError):
        replay_methods(rounds, ["r0", "r1"], ["draft_model", "eagle3", "ngram"])


RECORDED = Path(__file__).parent / "data" / "method_grids.json.gz"


def test_recorded_method_rounds_replay_to_the_method_users_would_pick() -> None:
    """Four recorded rounds each of the code and prose workloads (2026-12-04, four methods,
    k <= 4, concurrency 1, 4, 16; ``benchmarks/method_replay.py``): each round replayed as
    tune's measurements deploys the method the other rounds pooled rank best where speculation
    pays most (concurrency 1): the draft model on code, n-gram on prose; never speculates where
    they say it costs at 16 (both workloads), and at 4 on code in 3 of 4 rounds; reaches 95% of
    the best at concurrency 1 in 6 of 8 (single blocks per configuration leave code's draft
    length there to one block's noise). Code round 3 at 4: draft_model k=3's one block estimates
    a gain, its interval too wide to prove a tie with off, so the better estimate is deployed
    (issue 21: a tie is proven, never assumed); the other rounds put it 8% behind off."""
    sets = rounds_from_grids(*read_grids(RECORDED))
    assert [order for _, _, order in sets] == [["draft_model", "eagle3", "mtp", "ngram"]] * 2
    replays = [r for rounds, names, order in sets for r in replay_methods(rounds, names, order)]
    assert len(replays) == 8
    near_best = code_off_at_4 = 0
    for replay in replays:
        at = {row["concurrency"]: row for row in replay.rows}
        assert at[1]["best"].startswith(replay.chosen + " ")
        assert replay.chosen == ("draft_model" if replay.source.startswith("code/") else "ngram")
        assert at[16]["chosen"] == "off" and at[16]["verdict_agrees"] is not False
        if replay.source.startswith("code/"):
            code_off_at_4 += at[4]["chosen"] == "off"
        near_best += at[1]["share_of_best"] >= 0.95
    assert near_best >= 6 and code_off_at_4 >= 3


AVX512 = Path(__file__).parent / "data" / "method_grids_avx512.json.gz"


def test_rounds_of_a_row_blocked_engine_replay_near_the_best_with_the_first_row_measured() -> None:
    """Four recorded rounds each of the prose and built-in workloads on the AVX-512 machine
    (2026-12-06, ``benchmarks/method_replay.py --in-place``), where the engine's verify pass
    takes rows in pairs and the other rounds put draft_model's ``k = 3`` first at concurrency 1
    (k=4 is dearer for its length). Searched as on the embedded engine (step 5c measures every
    draft length at concurrency 1), every prose round deploys draft_model and reaches 95% of
    the best there; searched from the prediction's cells (a server that restarts per draft
    length), none does on either workload: the model puts ``k = 3`` behind ``k = 4``."""
    sets = rounds_from_grids(*read_grids(AVX512))
    shares: dict[tuple[str, bool], list[float]] = {}
    chosen: dict[tuple[str, bool], list[str]] = {}
    for rounds, names, order in sets:
        workload = names[0].split("/")[0]
        for in_place in (True, False):
            replays = replay_methods(rounds, names, order, switches_in_place=in_place)
            at1 = [next(r for r in x.rows if r["concurrency"] == 1) for x in replays]
            shares[(workload, in_place)] = [row["share_of_best"] for row in at1]
            chosen[(workload, in_place)] = [x.chosen for x in replays]
    assert chosen[("ms-prose", True)] == ["draft_model"] * 4
    assert all(s >= 0.95 for s in shares[("ms-prose", True)])
    assert sum(s >= 0.95 for s in shares[("ms-builtin", True)]) >= 2
    for workload in ("ms-prose", "ms-builtin"):
        assert not any(s >= 0.95 for s in shares[(workload, False)]), workload
