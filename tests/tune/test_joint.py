"""Methods' cells measured together (joint cells): the rounds' order, each method's paired cell
as its own search reads it back, the stopping rule that spends rounds where two methods are
close, blocks saved once under every label, and a real comparison on one server that resumes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from spectool.decide.duel import decided
from spectool.decide.methods import TIE_MARGIN
from spectool.decide.paired import paired_estimate
from spectool.measure.runner import TrialConfig, TrialResult, load_trials
from spectool.tuning.joint import (
    BASE,
    SLOWER,
    SPENT,
    Arm,
    JointBlocks,
    MethodFiles,
    duel_from_joint,
    duel_pairs,
    measure_joint,
    out_raced,
    out_raced_lines,
    record_joint,
    round_order,
)
from spectool.tuning.pairing import (
    MIN_PAIRS_OVER_BUDGET,
    NotSaved,
    look_every,
    looks_of,
    measure_paired,
)
from spectool.tuning.trials import CellPlan

from .test_pairing import C, K, Machine, quiet


class Bench:
    """One simulated machine serving several arms: each arm's speed, one shared clock."""

    def __init__(self, spec_ms: dict[Arm, float], speed=quiet) -> None:  # noqa: ANN001
        self.machines = {
            arm: Machine(ms, 2, speed, seed=i) for i, (arm, ms) in enumerate(spec_ms.items())
        }
        self.base = Machine(30.0, 2, speed, seed=99)
        self.calls: list[tuple[int, Arm | None]] = []
        self.saved: dict[tuple[int, Arm | None], TrialResult] = {}

    def block(self, pair: int, slot: Arm | None) -> TrialResult:
        machine = self.base if slot is BASE else self.machines[slot]
        clock = max(m.clock for m in (self.base, *self.machines.values()))
        machine.clock = clock
        trial = machine.block(pair, 0 if slot is BASE else slot.k)
        self.calls.append((pair, slot))
        self.saved[(pair, slot)] = trial
        return trial


A, B = Arm("draft_model", K), Arm("ngram", K)
PASS = {"pass_pairs": 1, "workload_prompts": 2 * C}


def test_every_round_sends_every_arm_and_each_takes_every_position() -> None:
    for arms in (1, 2, 3):
        n = arms + 1
        rounds = [round_order(arms, i) for i in range(2 * n)]
        assert all(sorted(r) == list(range(n)) for r in rounds)
        for slot in range(n):  # each slot in each position twice over two cycles
            assert sorted(r.index(slot) for r in rounds) == sorted(list(range(n)) * 2)
    assert round_order(1, 0) == [0, 1] and round_order(1, 1) == [1, 0]


def test_each_methods_cell_is_what_its_own_search_reads_back() -> None:
    """A drifting machine, two methods clearly apart: the joint cell stops at a look once both
    arms settle and the gap between them is proven; each arm's paired cell is what
    measure_paired rebuilds from the saved blocks, up to where the method alone would stop."""
    bench = Bench({A: 18.0, B: 24.0}, speed=lambda t: 1.0 + 0.6 * np.sin(t))
    cell = measure_joint(C, [B, A], bench.block, budget_s=1e9, **PASS)
    every = look_every(1)
    assert cell.arms == (A, B) and len(cell.rounds) % every == 0
    assert len(bench.calls) == 3 * len(cell.rounds)  # one block per slot and round
    for arm in (A, B):

        def lookup(pair: int, k: int, arm: Arm = arm) -> TrialResult:
            key = (pair, arm if k else BASE)
            if key not in bench.saved:
                raise NotSaved
            return bench.saved[key]

        alone = measure_paired(C, K, lookup, budget_s=1e9, **PASS)
        joint = cell.cells[arm]
        n = len(alone.pairs)
        assert n <= len(joint.pairs)
        assert [p.spec for p in alone.pairs] == [p.spec for p in joint.pairs[:n]]
        assert [p.base for p in alone.pairs] == [p.base for p in joint.pairs[:n]]
        assert joint.same_prompts == alone.same_prompts  # both read the blocks' prompts
        assert paired_estimate(joint).ci_high < 1.0  # both settled: they pay
    duel = duel_from_pairs(cell)
    assert duel.ratio == pytest.approx(0.75, rel=0.05)
    assert decided(duel, confidence=0.95, margin=TIE_MARGIN, looks=looks_of(1))
    quiet_bench = Bench({A: 18.0, B: 24.0})
    assert len(measure_joint(C, [A, B], quiet_bench.block, budget_s=1e9, **PASS).rounds) == every


def duel_from_pairs(cell):  # noqa: ANN001, ANN201
    from spectool.decide.duel import duel_estimate

    return duel_estimate(duel_pairs(A, B, cell.rounds), (A.method, B.method))


def test_close_methods_get_more_rounds_until_the_budget() -> None:
    """Both methods pay at the first look, but 4% apart with noisy steps neither a tie nor a
    gap is proven there: the cell measures on, and the budget ends it at a later look."""
    bench = Bench({A: 18.0, B: 18.7}, speed=lambda t: 1.0 + 0.3 * np.sin(3 * t))
    cell = measure_joint(C, [A, B], bench.block, budget_s=1e9, **PASS)
    assert len(cell.rounds) > look_every(1)
    noisy = Bench({A: 18.0, B: 18.7}, speed=lambda t: 1.0 + 0.3 * np.sin(3 * t))
    short = measure_joint(C, [A, B], noisy.block, budget_s=0.0, **PASS)
    # undecided at the first look, over budget at once: it stops once it has enough pairs
    assert len(short.rounds) == MIN_PAIRS_OVER_BUDGET <= len(cell.rounds)
    alone = measure_joint(C, [A], Bench({A: 18.0}).block, budget_s=1e9, **PASS)
    assert len(alone.rounds) == look_every(1)  # one method: nothing to compare


def test_a_settled_arm_out_of_the_race_retires_and_keeps_its_cell() -> None:
    """Three methods, two close (the race) and one far behind: the far one retires at the
    first look where it is settled (not among the two leaders), later rounds measure the two close arms
    and the baseline only, and the retired arm's cell is what its search alone reads back."""
    far = Arm("eagle3", K)
    bench = Bench({A: 18.0, B: 18.7, far: 45.0}, speed=lambda t: 1.0 + 0.3 * np.sin(3 * t))
    cell = measure_joint(C, [A, B, far], bench.block, budget_s=1e9, **PASS)
    held = [far in got for got in cell.rounds]
    retired = held.index(False)  # the first round without it: it retired at a look before
    assert retired % look_every(1) == 0 and not any(held[retired:])
    assert retired < len(cell.rounds)  # the close pair needed more rounds
    assert all(A in got and B in got and BASE in got for got in cell.rounds)
    assert len(cell.cells[far].pairs) == retired
    assert paired_estimate(cell.cells[far]).ci_low > 1.0  # settled: it does not pay
    calls = [slot for _, slot in bench.calls]
    assert calls.count(far) == retired and calls.count(A) == len(cell.rounds)

    def lookup(pair: int, k: int) -> TrialResult:
        key = (pair, far if k else BASE)
        if key not in bench.saved:
            raise NotSaved
        return bench.saved[key]

    alone = measure_paired(C, K, lookup, budget_s=1e9, **PASS)
    assert [q.spec for q in alone.pairs] == [q.spec for q in cell.cells[far].pairs]
    assert len(duel_pairs(A, far, cell.rounds)) == retired  # the rounds holding both


def test_an_arm_the_leader_beats_head_to_head_leaves_before_its_own_rule_stops(
    tmp_path: Path,
) -> None:
    """Three methods: two close leaders, and one about as fast as the baseline, so its own
    interval never settles (before, it stayed to the budget's end). The leader is proven faster
    than it head to head at the first look: it leaves there, out-raced; joint.jsonl records the
    rounds it held, and its search reads its cell back up to there (and, without that stop,
    would want blocks that were never measured)."""
    even = Arm("eagle3", K)
    bench = Bench({A: 18.0, B: 18.7, even: 90.0}, speed=lambda t: 1.0 + 0.3 * np.sin(3 * t))
    cell = measure_joint(C, [A, B, even], bench.block, budget_s=1e9, **PASS)
    first = look_every(1)
    assert cell.out_raced == {even: (first, A, SLOWER)}
    assert [even in got for got in cell.rounds] == [True] * first + [False] * (
        len(cell.rounds) - first
    )
    assert len(cell.rounds) > first  # the close pair went on
    assert len(cell.cells[even].pairs) == first
    assert paired_estimate(cell.cells[even]).verdict == "inconclusive"

    def lookup(pair: int, k: int) -> TrialResult:
        key = (pair, even if k else BASE)
        if key not in bench.saved:
            raise NotSaved
        return bench.saved[key]

    with pytest.raises(NotSaved):  # its own rule alone wants more than the rounds it held
        measure_paired(C, K, lookup, budget_s=1e9, **PASS)
    record_joint(tmp_path, cell)
    stops = out_raced(tmp_path, "eagle3")
    assert stops == {(C, K): first} and out_raced(tmp_path, "ngram") == {}
    alone = measure_paired(C, K, lookup, budget_s=1e9, **PASS, stop_after=stops[(C, K)])
    assert [q.spec for q in alone.pairs] == [q.spec for q in cell.cells[even].pairs]
    assert out_raced_lines(tmp_path) == [
        f"concurrency {C}: eagle3 k={K} left the rounds after {first}, draft_model k={K} "
        "proven faster head to head; its cell is what those rounds say"
    ]


def test_a_third_arm_leaves_when_its_budget_is_spent_the_leaders_keep_the_minimum() -> None:
    """Budget spent at the first look: the two leaders stay to the pairs the budget's minimum
    asks for (their verdicts decide), the third method, not proven slower in 4 pairs, leaves
    there ('spent'); before, all three stayed."""
    third = Arm("eagle3", K)
    bench = Bench({A: 18.0, B: 18.5, third: 19.5}, speed=lambda t: 1.0 + 0.3 * np.sin(3 * t))
    cell = measure_joint(C, [A, B, third], bench.block, budget_s=0.0, **PASS)
    first = look_every(1)
    assert cell.out_raced == {third: (first, A, SPENT)}
    assert len(cell.rounds) == MIN_PAIRS_OVER_BUDGET > first
    assert [third in got for got in cell.rounds].count(True) == first
    assert all(A in got and B in got for got in cell.rounds)


def _plans() -> dict[str, CellPlan]:
    return {
        m: CellPlan("torch", m, f"fp-{m}", "", num_prompts=4, max_tokens=8, workload_prompts=4)
        for m in ("draft_model", "ngram")
    }


def test_a_block_is_measured_once_and_saved_under_every_label_that_uses_it(
    tmp_path: Path,
) -> None:
    plans = _plans()
    paths = {m: tmp_path / m / "trials.jsonl" for m in plans}
    for p in paths.values():
        p.parent.mkdir()
    bench = Bench({A: 18.0, B: 24.0})
    measured: list[str] = []

    def measure(slot, config: TrialConfig, path: Path) -> TrialResult:  # noqa: ANN001
        measured.append(config.label)
        trial = dataclasses.replace(bench.block(len(measured), slot), config=config)
        with path.open("a") as f:
            f.write(json.dumps(trial.to_json()) + "\n")
        return trial

    files = {m: MethodFiles.load(plans[m], paths[m]) for m in plans}
    blocks = JointBlocks(files, measure)
    arms = (A, B)
    cell = measure_joint(C, arms, lambda i, s: blocks.block(C, arms, i, s), budget_s=0.0, **PASS)
    record_joint(tmp_path, cell)
    rounds = len(cell.rounds)
    assert len(measured) == 3 * rounds
    for arm in arms:  # each method's file: its own blocks and every baseline block, labelled
        saved = load_trials(paths[arm.method])
        assert len(saved) == 2 * rounds
        plan = plans[arm.method]
        for i in range(rounds):
            assert plan.block_config(C, K, i, K).key() in saved
            assert plan.block_config(C, K, i, 0).key() in saved
        # the method's own search finds its paired cell there (a resumed run would)

        def lookup(pair: int, k: int, plan: CellPlan = plan, saved=saved) -> TrialResult:  # noqa: ANN001
            key = plan.block_config(C, K, pair, k).key()
            if key not in saved:
                raise NotSaved
            return saved[key]

        assert len(measure_paired(C, K, lookup, budget_s=0.0, **PASS).pairs) == rounds
    # resumed: nothing measured again, the same cell
    again_files = {m: MethodFiles.load(plans[m], paths[m]) for m in plans}
    again = JointBlocks(again_files, measure)
    before = len(measured)
    cell2 = measure_joint(C, arms, lambda i, s: again.block(C, arms, i, s), budget_s=0.0, **PASS)
    assert len(measured) == before and len(cell2.rounds) == rounds
    est = duel_from_joint(tmp_path, again_files, A, B, C, objective="steps")
    assert est is not None and est.pairs == rounds and est.ratio == pytest.approx(0.75, rel=0.05)
    assert duel_from_joint(tmp_path, again_files, A, Arm("ngram", 1), C, objective="steps") is None


def test_a_real_comparison_measures_the_methods_together_on_one_server_and_resumes(
    tmp_path: Path, tune_models: tuple[Path, Path], tune_workload: Path
) -> None:
    from spectool.tuning.compare import method_requests, resolve_all
    from spectool.tuning.joint import INDEX_NAME
    from spectool.tuning.request import TuneRequest
    from spectool.tuning.together import can_share, run_joint

    target, drafter = tune_models
    common = dict(
        target=str(target), engine="torch", concurrencies=(1,), max_tokens=8, num_prompts=4,
        workload=tune_workload, max_draft_len=2, threads=1, budget_s=0.0,
    )  # fmt: skip
    top = tmp_path / "run"
    requests = [
        TuneRequest(drafter=str(drafter), out=top / "draft_model", **common),
        TuneRequest(method="ngram", out=top / "ngram", **common),
    ]
    assert method_requests(requests[0]) == [requests[0]]
    resolved = resolve_all(requests)
    assert can_share(resolved)
    messages: list[str] = []

    class Say:
        def on_message(self, text: str) -> None:
            messages.append(text)

        def __getattr__(self, name: str):  # noqa: ANN204 (every other hook: nothing to do)
            return lambda *a, **k: None

    done = run_joint(resolved, progress=Say())  # type: ignore[arg-type]
    index = [json.loads(x) for x in (top / INDEX_NAME).read_text().splitlines()]
    both = [row for row in index if {m for m, _ in row["arms"]} == {"draft_model", "ngram"}]
    assert both and both[0]["concurrency"] == 1
    assert any("together on one server" in m for m in messages)
    assert all(o.server_starts == 1 for o in done.outcomes)  # one server for both methods
    summary = json.loads((top / "methods.json").read_text())
    assert summary["design"] == "together" and summary["chosen"] in ("draft_model", "ngram")
    assert "measured together" in (top / "report.md").read_text()
    lines = {m: (top / m / "trials.jsonl").read_text() for m in ("draft_model", "ngram")}
    resumed = [
        dataclasses.replace(r, request=dataclasses.replace(r.request, resume=True))
        for r in resolved
    ]
    again = run_joint(resumed)
    assert {m: (top / m / "trials.jsonl").read_text() for m in lines} == lines
    assert again.choice.chosen == done.choice.chosen
