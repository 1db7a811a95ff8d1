"""Methods compared on one server: their cells at a concurrency measured together, in rounds.

Why: a method measured in its own window, minutes after its rival, is compared with the rival
through two baselines and whatever the machine did in between; and every method paying for its
own baseline blocks doubles the cost of a comparison. The embedded engine holds every method's
drafter at once and switches method and draft length in place
(:meth:`~spectool.tuning.torch_driver.TorchDriver.serve`), so ``tune`` measures the methods'
cells at one concurrency together: a *joint cell* of arms ``baseline, (m1, k1), (m2, k2), ...``.

* Round ``i`` is one block per arm, all sending the same prompts (the block's share of the
  shuffled passes over the workload, :meth:`~spectool.tuning.trials.CellPlan.block_config`),
  in an order that rotates each round and reverses every other cycle (:func:`round_order`), so
  a steady drift favours no arm and every arm sits beside every other.
* Each arm with the baseline block of its round is one pair of that method's paired cell
  (:class:`~spectool.decide.paired.PairedCell`); the block is saved in the method's own
  ``trials.jsonl`` under the labels the method's search uses (the baseline block under each
  arm's label), so every method's search (:func:`spectool.decide.tune.tune`) reads its cells
  as a resumed run would, and stops where it would have stopped alone.
* Looks fall after whole passes (:func:`~spectool.tuning.pairing.look_every`). The cell stops
  when every arm's own stopping rule would have stopped (settled, or over ``budget_s``), and
  the two best methods' arms are *decided* head to head (:func:`spectool.decide.duel.decided`:
  equivalent within ``TIE_MARGIN``, or one proven faster), or over budget, or at the most pairs.
  So the extra rounds a close comparison needs are spent where it is close.
* An arm *retires* at a look where its own rule has stopped (settled, or over budget) and it is
  not one of the two leading methods: later rounds measure only the arms still in the race. Its
  cell is what it holds at that look, the look where its search alone would have stopped, so
  its replay is unchanged; a four-method comparison then pays the extra rounds of a close
  duel for two arms, not four.
* An arm out of the two leaders, the leader paying, is *out-raced* at a look where the
  leading method is proven faster than it head to head (:func:`~spectool.decide.duel.
  proven_faster`, the same rounds, at the looks' corrected confidence; ``slower``), or where
  it has spent its budget (``spent``), even if its own rule has not stopped: the budget ends
  no cell before :data:`~spectool.tuning.pairing.MIN_PAIRS_OVER_BUDGET` pairs because four
  are too few for a verdict a deployment rests on, and at this concurrency that is a
  leader's. Those rounds are the dearest a joint cell spends (at high concurrency a look holds
  four blocks per arm). ``joint.jsonl`` records the rounds it held (``out_raced``) and its
  method's search reads its cell up to there (:func:`out_raced`, ``stop_after`` of
  :func:`~spectool.tuning.pairing.measure_paired`), so the replay still matches: the cell is
  what those rounds say, often inconclusive against the baseline (that method off there).
* Two arms of one joint cell give the methods' head-to-head estimate for free
  (:func:`duel_from_joint`): the same rounds, the same prompts, the same minute.

Which cells: the methods' searches run *dry* (:func:`spectool.tuning.session.run_tune`): each
raises :class:`Wanted` at the first paired cell it lacks, or :class:`Ready` with its result;
the wanted cells at the first one's concurrency form the next joint cell, and the searches run
again, until none wants more (:func:`spectool.tuning.compare.run_joint`). ``DIR/joint.jsonl``
lists the joint cells measured (concurrency, arms, rounds).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from spectool.decide.duel import DuelEstimate, DuelPair, decided, duel_estimate, proven_faster
from spectool.decide.methods import TIE_MARGIN
from spectool.decide.paired import BlockPair, PairedCell, paired_estimate, settled
from spectool.decide.result import TuneResult
from spectool.decide.verdict import PairedEstimate
from spectool.io import append_line
from spectool.measure.runner import TrialConfig, TrialResult, load_trials
from spectool.tuning.pairing import (
    look_every,
    looks_of,
    max_pairs,
    over_budget,
    prompt_bag,
    prompts_sent,
    rest_looks,
    strata_of,
)
from spectool.tuning.trials import CellPlan, pooled_cell

INDEX_NAME = "joint.jsonl"


class Wanted(Exception):  # noqa: N818 (a signal, not an error)
    """A dry search wants the paired cell ``(c, k)``, which ``trials.jsonl`` lacks."""

    def __init__(self, c: int, k: int) -> None:
        super().__init__(f"cell (concurrency={c}, k={k}) not measured yet")
        self.c, self.k = c, k


class Ready(Exception):  # noqa: N818
    """A dry search found every cell it needs: its result."""

    def __init__(self, result: TuneResult) -> None:
        super().__init__("every cell measured")
        self.result = result


@dataclass(frozen=True, order=True)
class Arm:
    """One method at one draft length."""

    method: str
    k: int

    def __str__(self) -> str:
        return f"{self.method} k={self.k}"


SLOWER, SPENT = "slower", "spent"  # why an arm out of the race left early (JointCell.out_raced)
BASE = None  # the baseline arm of a round
Slot = Arm | None
BlockFn = Callable[[int, Slot], TrialResult]  # (round, arm or BASE) -> the block's trial


def round_order(arms: int, i: int) -> list[int]:
    """Slot indices (0: the baseline, 1..: the arms) of round ``i``: rotated by ``i``, and
    reversed in every other cycle of rotations, so each slot takes each position."""
    n = arms + 1
    order = [(j + i) % n for j in range(n)]
    return order[::-1] if (i // n) % 2 else order


@dataclass(frozen=True)
class JointCell:
    """A measured joint cell: its rounds (trials per slot) and each arm's paired cell."""

    concurrency: int
    arms: tuple[Arm, ...]
    rounds: tuple[dict[Slot, TrialResult], ...]
    cells: dict[Arm, PairedCell]
    # arms out of the race that left before their own rule stopped: (rounds held, the
    # leader's arm, why: SLOWER or SPENT)
    out_raced: dict[Arm, tuple[int, Arm, str]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "arms": [[a.method, a.k] for a in self.arms],
            "rounds": len(self.rounds),
            "out_raced": [
                [a.method, a.k, n, lead.method, lead.k, why]
                for a, (n, lead, why) in sorted(self.out_raced.items())
            ],
        }


def _paired(
    arm: Arm,
    arms: Sequence[Arm],
    rounds: Sequence[dict[Slot, TrialResult]],
    looks: int,
    objective: str,
    workload_prompts: int,
    rest_looks: int = 0,
) -> PairedCell:
    """``arm``'s paired cell: its block and the baseline block of every round that holds it
    (a round's slots are in the order they were measured); ``rest_looks``: the looks the
    budget left untaken if it ends the cell at this look."""
    pairs = []
    bags: list[tuple[int, ...]] = []  # each round's prompts (PairedCell.strata)
    for got in rounds:
        if arm not in got:
            break  # retired: no later round holds it
        order = list(got)
        spec, base = got[arm], got[BASE]
        bags.append(prompt_bag(spec))
        pairs.append(
            BlockPair(
                pooled_cell([spec], arm.k),
                pooled_cell([base], 0),
                spec_first=order.index(arm) < order.index(BASE),
            )
        )
    return PairedCell(
        tuple(pairs),
        looks=looks,
        objective=objective,
        prompts_covered=len(set().union(*bags)),
        workload_prompts=workload_prompts,
        rest_looks=rest_looks,
        strata=strata_of(bags),
    )


def duel_strata(a: Arm, b: Arm, rounds: Sequence[Mapping[Slot, TrialResult]]) -> tuple[int, ...]:
    """Per pair of :func:`duel_pairs`, its stratum of the same prompts
    (:attr:`~spectool.decide.paired.PairedCell.strata`)."""
    return strata_of([prompt_bag(got[a]) for got in rounds if a in got and b in got])


def duel_pairs(a: Arm, b: Arm, rounds: Sequence[dict[Slot, TrialResult]]) -> list[DuelPair]:
    """The head-to-head pairs of arms ``a`` and ``b``: their blocks of every round holding
    both (an arm that retired left the later rounds)."""
    return [
        DuelPair(pooled_cell([got[a]], a.k), pooled_cell([got[b]], b.k), a_first=i % 2 == 0)
        for i, got in enumerate(rounds)
        if a in got and b in got
    ]


def leading_arms(cells: Mapping[Arm, PairedCell], estimates: Mapping[Arm, float]) -> list[Arm]:
    """Each method's best arm (lowest estimate), best first."""
    best: dict[str, Arm] = {}
    for arm in cells:
        if arm.method not in best or estimates[arm] < estimates[best[arm.method]]:
            best[arm.method] = arm
    return sorted(best.values(), key=lambda a: estimates[a])


def measure_joint(
    c: int,
    arms: Sequence[Arm],
    block: BlockFn,
    *,
    pass_pairs: int,
    workload_prompts: int,
    threshold: float = 1.0,
    confidence: float = 0.95,
    seed: int = 0,
    budget_s: float = 30.0,
    objective: str = "steps",
) -> JointCell:
    """The joint cell of ``arms`` at concurrency ``c``; see the module docstring."""
    arms = tuple(sorted(set(arms)))
    every, most, looks = look_every(pass_pairs), max_pairs(pass_pairs), looks_of(pass_pairs)
    active = list(arms)
    rounds: list[dict[Slot, TrialResult]] = []
    spent = dict.fromkeys(arms, 0.0)
    out_raced: dict[Arm, tuple[int, Arm, str]] = {}
    cells: dict[Arm, PairedCell] = {}
    estimates: dict[Arm, PairedEstimate] = {}
    for i in range(most):
        got: dict[Slot, TrialResult] = {}
        slots: list[Slot] = [BASE, *active]
        for j in round_order(len(active), i):
            got[slots[j]] = block(i, slots[j])
        rounds.append(got)
        for arm in active:
            spent[arm] += got[arm].wall_time_s + got[BASE].wall_time_s
        if len(rounds) % every:
            continue
        forced = {arm: over_budget(spent[arm], budget_s, len(rounds)) for arm in active}
        for arm in active:
            rest = rest_looks(forced[arm], len(rounds), every, looks)
            cells[arm] = _paired(arm, arms, rounds, looks, objective, workload_prompts, rest)
            estimates[arm] = paired_estimate(cells[arm], confidence=confidence, seed=seed)
        done = {arm for arm in active if settled(estimates[arm], threshold) or forced[arm]}
        over = all(forced.values())
        ratios = {arm: estimates[arm].ratio for arm in arms}
        lead = leading_arms(cells, ratios)
        compared = True
        if len(lead) >= 2 and ratios[lead[0]] < threshold:
            a, b = lead[0], lead[1]
            duel = duel_estimate(
                duel_pairs(a, b, rounds),
                (a.method, b.method),
                objective=objective,
                strata=duel_strata(a, b, rounds),
            )
            compared = decided(duel, confidence=confidence, margin=TIE_MARGIN, looks=looks)
        beaten = _beaten(
            active, done, lead, ratios, rounds, threshold, confidence, looks, objective
        )
        for arm in active:
            if arm in beaten:
                out_raced[arm] = (len(rounds), lead[0], SLOWER)
            elif _spent_out_of_race(arm, done, lead, ratios, threshold, spent[arm], budget_s):
                out_raced[arm] = (len(rounds), lead[0], SPENT)
            else:
                continue
            done.add(arm)
        if done == set(active) and (compared or over):
            break
        active = [arm for arm in active if arm not in done or arm in lead[:2]]
    # the last round is always a look (max_pairs is a whole number of looks): cells hold them all
    return JointCell(c, arms, tuple(rounds), cells, out_raced)


def _spent_out_of_race(
    arm: Arm,
    done: set[Arm],
    lead: Sequence[Arm],
    ratios: Mapping[Arm, float],
    threshold: float,
    spent_s: float,
    budget_s: float,
) -> bool:
    """Whether ``arm`` (still racing, not one of the two leaders, the leader paying) has spent
    its budget: the pairs the budget's minimum (:data:`~spectool.tuning.pairing.
    MIN_PAIRS_OVER_BUDGET`) asks for protect the verdict a deployment rests on, which at this
    concurrency is a leader's (module docstring)."""
    if arm in done or arm in lead[:2] or not lead or ratios[lead[0]] >= threshold:
        return False
    return spent_s >= budget_s


def _beaten(
    active: Sequence[Arm],
    done: set[Arm],
    lead: Sequence[Arm],
    ratios: Mapping[Arm, float],
    rounds: Sequence[dict[Slot, TrialResult]],
    threshold: float,
    confidence: float,
    looks: int,
    objective: str,
) -> list[Arm]:
    """The arms still racing, out of the two leaders, that the leading method (paying) is
    proven faster than head to head (module docstring)."""
    if not lead or ratios[lead[0]] >= threshold:
        return []
    best = lead[0]
    beaten = []
    for arm in active:
        if arm in done or arm in lead[:2] or arm.method == best.method:
            continue
        duel = duel_estimate(
            duel_pairs(best, arm, rounds),
            (best.method, arm.method),
            objective=objective,
            strata=duel_strata(best, arm, rounds),
        )
        if proven_faster(duel, confidence=confidence, looks=looks):
            beaten.append(arm)
    return beaten


@dataclass
class MethodFiles:
    """One method's trial plan and ``trials.jsonl`` (and the trials in it)."""

    plan: CellPlan
    path: Path
    saved: dict[str, TrialResult]

    @classmethod
    def load(cls, plan: CellPlan, path: Path) -> MethodFiles:
        return cls(plan, path, load_trials(path))


class JointBlocks:
    """Blocks of joint cells, each measured once and saved under every label that uses it."""

    def __init__(
        self,
        files: Mapping[str, MethodFiles],
        measure: Callable[[Slot, TrialConfig, Path], TrialResult],
    ) -> None:
        self.files = files
        self.measure = measure

    def configs(
        self, c: int, arms: Sequence[Arm], pair: int, slot: Slot
    ) -> list[tuple[str, TrialConfig]]:
        """(method, config) of every label the block is saved under."""
        if slot is not BASE:
            plan = self.files[slot.method].plan
            return [(slot.method, plan.block_config(c, slot.k, pair, slot.k))]
        return [(a.method, self.files[a.method].plan.block_config(c, a.k, pair, 0)) for a in arms]

    def block(self, c: int, arms: Sequence[Arm], pair: int, slot: Slot) -> TrialResult:
        configs = self.configs(c, arms, pair, slot)
        found = next(
            (
                self.files[m].saved[cfg.key()]
                for m, cfg in configs
                if cfg.key() in self.files[m].saved
            ),
            None,
        )
        if found is None:
            method, config = configs[0]
            found = self.measure(slot, config, self.files[method].path)
            self.files[method].saved[config.key()] = found
        for method, config in configs:
            side = self.files[method]
            if config.key() not in side.saved:
                copy = dataclasses.replace(found, config=config)
                append_line(side.path, json.dumps(copy.to_json(), separators=(",", ":")))
                side.saved[config.key()] = copy
        return found


def record_joint(top: Path, cell: JointCell) -> None:
    """Append the joint cell to ``DIR/joint.jsonl``."""
    append_line(top / INDEX_NAME, json.dumps(cell.to_json(), separators=(",", ":")))


def _rows(top: Path) -> list[dict]:
    """The rows of ``DIR/joint.jsonl`` (none without it)."""
    path = top / INDEX_NAME
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def joint_index(top: Path) -> list[tuple[int, tuple[Arm, ...], int]]:
    """``(concurrency, arms, rounds)`` of every joint cell ``DIR/joint.jsonl`` lists."""
    return [
        (
            int(row["concurrency"]),
            tuple(Arm(str(m), int(k)) for m, k in row["arms"]),
            int(row["rounds"]),
        )
        for row in _rows(top)
    ]


def out_raced(top: Path, method: str) -> dict[tuple[int, int], int]:
    """``(concurrency, k) -> rounds held`` of ``method``'s arms that a joint cell listed in
    ``DIR/joint.jsonl`` out-raced (its cell ends there)."""
    return {
        (int(row["concurrency"]), int(k)): int(n)
        for row in _rows(top)
        for m, k, n, *_ in row.get("out_raced", [])
        if m == method
    }


def out_raced_lines(top: Path) -> list[str]:
    """One line per out-raced arm in ``DIR/joint.jsonl``, for the report."""
    why_words = {
        SLOWER: "proven faster head to head",
        SPENT: "ahead, and its budget spent (the pairs the budget's minimum asks for are a "
        "leader's)",
    }
    return [
        f"concurrency {row['concurrency']}: {m} k={k} left the rounds after {n}, "
        f"{lead_m} k={lead_k} {why_words[why]}; its cell is what those rounds say"
        for row in _rows(top)
        for m, k, n, lead_m, lead_k, why in row.get("out_raced", [])
    ]


def duel_from_joint(
    top: Path,
    files: Mapping[str, MethodFiles],
    a: Arm,
    b: Arm,
    c: int,
    *,
    objective: str,
) -> DuelEstimate | None:
    """``a`` over ``b`` at ``c`` from the rounds of a joint cell that held both (None: none
    did, or fewer than two rounds)."""
    for conc, arms, n in joint_index(top):
        if conc != c or a not in arms or b not in arms or n < 2:
            continue
        rounds: list[dict[Slot, TrialResult]] = []
        for i in range(n):
            got: dict[Slot, TrialResult] = {}
            for arm in (a, b):
                side = files[arm.method]
                trial = side.saved.get(side.plan.block_config(c, arm.k, i, arm.k).key())
                if trial is not None:
                    got[arm] = trial
            if len(got) < 2:
                break  # one of them retired from the cell (or its blocks are gone)
            rounds.append(got)
        if len(rounds) < 2:
            continue
        pairs = duel_pairs(a, b, rounds)
        sent = {p for got in rounds for t in got.values() for p in prompts_sent(t)}
        return duel_estimate(
            pairs,
            (a.method, b.method),
            prompts_covered=len(sent),
            workload_prompts=files[a.method].plan.prompts_in_workload,
            objective=objective,
            strata=duel_strata(a, b, rounds),
        )
    return None
