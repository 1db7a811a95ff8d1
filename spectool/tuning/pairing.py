"""Measure one speculative cell as interleaved pairs of blocks, adding pairs until it is settled.

The design and the statistics are :mod:`spectool.decide.paired`'s; this module only orders the
blocks and decides when to stop:

* pair ``i`` is a speculative block (draft length ``k``) and a baseline block (0) at the same
  concurrency, back to back on one server that switches its draft length in place; the order
  alternates (A B, B A, A B, ...), so a steady drift of the machine favours neither arm;
* the pairs walk through shuffled passes over the whole workload (``pass_pairs`` pairs a pass,
  :meth:`spectool.tuning.trials.CellPlan.block_config`), and the interval is looked at only
  after whole passes: every :func:`look_every` pairs (at least :data:`LOOK_EVERY`). So the
  first look already counts every prompt of the workload once, and every look weighs each
  prompt alike: acceptance that depends on the prompt cannot bias a cell that stopped early;
* at each look the cell stops as soon as the interval lies wholly on one side of the threshold
  (1, or ``1 - min_gain``), when :func:`max_pairs` pairs are measured, or when the blocks have
  used ``budget_s`` seconds and hold :data:`MIN_PAIRS_OVER_BUDGET` pairs (:func:`over_budget`); an
  unsettled cell is then ``inconclusive``;
* ``block(pair, arm)`` returns a trial: measured now, or found in ``trials.jsonl`` by a resumed
  run. The stopping rule depends on the blocks alone (their measurements and wall times), so a
  resumed run stops where an uninterrupted one would.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from spectool.decide.paired import BlockPair, PairedCell, paired_estimate, settled
from spectool.decide.verdict import CellVerdict, Design
from spectool.measure.runner import TrialResult
from spectool.tuning.trials import pooled_cell

LOOK_EVERY = 4  # the fewest pairs between two looks at the interval
MAX_PAIRS = 24  # the most pairs a cell takes, unless two looks need more
LOOKS = MAX_PAIRS // LOOK_EVERY  # looks of a cell whose pass fits in one block
DEFAULT_BUDGET_S = 30.0
MIN_PAIRS_OVER_BUDGET = 2 * LOOK_EVERY  # pairs before the budget may end a cell (over_budget)

BlockFn = Callable[[int, int], TrialResult]  # (pair index, arm: k or 0) -> the block's trial


def over_budget(spent_s: float, budget_s: float, pairs: int) -> bool:
    """Whether the budget ends a cell at this look: ``budget_s`` spent, and at least
    :data:`MIN_PAIRS_OVER_BUDGET` pairs measured. Four pairs are too few to end on: at a
    concurrency whose pass is one pair, a first look holds 4, whose Bonferroni-corrected t
    interval (3 degrees of freedom) is so wide on a loaded machine that a cell paying 1.7x
    stayed inconclusive, and so off (measured: code workload, concurrency 16, 5 runs of 5).
    At low concurrency a first look already holds a whole pass of pairs (16 at concurrency 1)."""
    return spent_s >= budget_s and pairs >= MIN_PAIRS_OVER_BUDGET


def rest_looks(forced: bool, pairs: int, every: int, looks: int) -> int:
    """The looks a cell leaves untaken when the budget ends it at this one (``forced``), 0
    otherwise: the last look spends their share of the error rate too
    (:func:`spectool.decide.paired.look_alpha`)."""
    return max(0, looks - pairs // every) if forced else 0


def look_every(pass_pairs: int) -> int:
    """Pairs between two looks: whole passes, at least :data:`LOOK_EVERY` pairs."""
    if pass_pairs < 1:
        raise ValueError(f"a pass needs at least one pair, got {pass_pairs}")
    return pass_pairs * -(-LOOK_EVERY // pass_pairs)


def max_pairs(pass_pairs: int) -> int:
    """The most pairs of a cell: :data:`MAX_PAIRS`, or two looks where a look needs more."""
    every = look_every(pass_pairs)
    return max(every * (MAX_PAIRS // every), 2 * every)


def looks_of(pass_pairs: int) -> int:
    """How often a cell's interval may be looked at (its Bonferroni correction)."""
    return max_pairs(pass_pairs) // look_every(pass_pairs)


def measure_paired(
    concurrency: int,
    k: int,
    block: BlockFn,
    *,
    threshold: float = 1.0,
    confidence: float = 0.95,
    seed: int = 0,
    budget_s: float = DEFAULT_BUDGET_S,
    pass_pairs: int = 1,
    workload_prompts: int = 0,
    objective: str = "steps",
    stop_after: int | None = None,
    design: Design = "interleaved",
) -> PairedCell:
    """The paired cell ``(concurrency, k)``; see the module docstring.

    ``pass_pairs``: pairs that cover the workload once (``workload_prompts`` prompts).
    ``objective``: what the pairs compare, and so what settles the cell
    (:data:`~spectool.decide.verdict.OBJECTIVES`). ``stop_after``: the cell ends there (a look)
    whatever its own rule says: the pairs a joint cell gave an arm that it *out-raced*
    (:mod:`spectool.tuning.joint`). ``design``: ``interleaved`` (one server, arms back to back)
    or ``concurrent`` (two GPU sets, both arms at once: :mod:`spectool.tuning.side_by_side`;
    ``block`` then measures a pair's arms together and the order below only says which it is
    asked for first).
    """
    every, most, looks = look_every(pass_pairs), max_pairs(pass_pairs), looks_of(pass_pairs)
    if stop_after is not None:
        most = min(most, stop_after)
    pairs: list[BlockPair] = []
    bags: list[tuple[int, ...]] = []  # each pair's prompts (PairedCell.strata)
    spent = 0.0
    rest = 0  # looks the budget left untaken when it ended the cell (PairedCell.rest_looks)

    def cell() -> PairedCell:
        return PairedCell(
            tuple(pairs),
            looks=looks,
            objective=objective,
            prompts_covered=len(set().union(*bags)),
            workload_prompts=workload_prompts,
            design=design,
            rest_looks=rest,
            strata=strata_of(bags),
        )

    for i in range(most):
        spec_first = i % 2 == 0
        arms = (k, 0) if spec_first else (0, k)
        got, walls = {}, []
        for arm in arms:
            trial = block(i, arm)
            walls.append(trial.wall_time_s)
            got[arm] = pooled_cell([trial], arm, level=concurrency)
        spent += max(walls) if design == "concurrent" else sum(walls)  # blocks at once: wall
        pairs.append(BlockPair(got[k], got[0], spec_first=spec_first))
        bags.append(prompt_bag(trial))  # both arms of a pair send the same prompts
        if len(pairs) % every:
            continue
        forced = over_budget(spent, budget_s, len(pairs))
        rest = rest_looks(forced, len(pairs), every, looks)
        estimate = paired_estimate(cell(), confidence=confidence, seed=seed)
        if settled(estimate, threshold) or forced:
            break
    done = cell()
    assert done.key == (concurrency, k)
    return done


def prompt_bag(trial: TrialResult) -> tuple[int, ...]:
    """The workload indices of the prompts a block sent (its measured requests), sorted, a
    prompt sent twice twice."""
    config = trial.config
    order = config.prompt_indices
    n = len(trial.records) or config.num_prompts
    if order:
        return tuple(sorted(order[i % len(order)] for i in range(n)))
    return tuple(config.prompt_offset + i for i in range(n))


def strata_of(bags: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """Per pair, its stratum (:attr:`~spectool.decide.paired.PairedCell.strata`): pairs that
    sent the same prompts share one, numbered in order of appearance."""
    index: dict[tuple[int, ...], int] = {}
    return tuple(index.setdefault(bag, len(index)) for bag in bags)


def prompts_sent(trial: TrialResult) -> set[int]:
    """The workload indices of the prompts a block sent (its measured requests)."""
    return set(prompt_bag(trial))


class NotSaved(Exception):
    """A block that a resumed run has not measured yet."""


DRIFT_NOTE = 0.10  # an arm whose speed moved more than this within a cell gets a note


def drift_notes(verdicts: Sequence[CellVerdict], choices: Mapping[int, int]) -> list[str]:
    """Notes for paired cells during which either arm's speed moved by more than 10%, and for
    cells with pairs set aside as disturbed (:func:`spectool.decide.pair_stats.disturbed`).

    The pairs absorb a change that hits both arms alike; the note says how much moved and
    whether the cell still settled, so a reader sees why a cell came out ``inconclusive``.
    """
    notes = []
    for v in verdicts:
        est = v.paired
        if est is None:
            continue
        if est.set_aside:
            aside = ", ".join(
                f"pair {i + 1} ({math.exp(est.log_ratios[i]):.3f})" for i in est.set_aside
            )
            notes.append(
                f"concurrency {v.concurrency}, k={v.k}: {aside} of {est.pairs} set aside as "
                f"disturbed (every block sent the whole workload; it lay far from the other "
                f"pairs): ratio {v.ratio:.3f} (CI {v.ci_low:.3f}-{v.ci_high:.3f}) from the rest"
            )
        moved = [
            (arm, drift)
            for arm, drift in (("baseline", est.drift_base), ("speculative", est.drift_spec))
            if abs(drift - 1.0) > DRIFT_NOTE
        ]
        if not moved:
            continue
        what = " and ".join(f"the {arm} arm by {drift - 1.0:+.0%}" for arm, drift in moved)
        if v.verdict == "inconclusive":
            outcome = (
                f"the cell stayed inconclusive after {est.pairs} pairs (ratio {v.ratio:.3f}, "
                f"CI {v.ci_low:.3f}-{v.ci_high:.3f})"
            )
            if choices.get(v.concurrency) == v.k:
                outcome += "; it was kept only to gate the schedule (see above)"
        else:
            outcome = (
                f"the pairs absorbed it: {v.verdict.replace('_', ' ')} after {est.pairs} pairs "
                f"(CI {v.ci_low:.3f}-{v.ci_high:.3f})"
            )
        if est.design == "bracketed":
            what = f"the baseline by {est.drift_base - 1.0:+.0%} between its two brackets"
        notes.append(
            f"concurrency {v.concurrency}, k={v.k}: the machine's speed changed while the cell "
            f"was measured ({what}); {outcome}"
        )
    return notes
