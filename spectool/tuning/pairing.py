"""Measure one speculative cell as interleaved pairs of blocks, adding pairs until it is settled.

The design and the statistics are :mod:`spectool.decide.paired`'s; this module only orders the
blocks and decides when to stop:

* pair ``i`` is a speculative block (draft length ``k``) and a baseline block (0) at the same
  concurrency, back to back on one server that switches its draft length in place; the order
  alternates (A B, B A, A B, ...), so a steady drift of the machine favours neither arm;
* after every :data:`LOOK_EVERY` pairs the paired interval is computed; the cell stops as soon as it lies wholly on one side of the
  threshold (1, or ``1 - min_gain``), when :data:`MAX_PAIRS` pairs are measured, or when the
  blocks have used ``budget_s`` seconds; an unsettled cell is then ``inconclusive``;
* ``block(pair, arm)`` returns a trial: measured now, or found in ``trials.jsonl`` by a resumed
  run. The stopping rule depends on the blocks alone (their measurements and wall times), so a
  resumed run stops where an uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from spectool.decide.paired import BlockPair, PairedCell, paired_estimate, settled
from spectool.decide.verdict import CellVerdict
from spectool.measure.runner import TrialResult
from spectool.tuning.trials import pooled_cell

LOOK_EVERY = 4  # the interval is looked at after pair 4, 8, ..., MAX_PAIRS
MAX_PAIRS = 24
LOOKS = MAX_PAIRS // LOOK_EVERY
DEFAULT_BUDGET_S = 30.0

BlockFn = Callable[[int, int], TrialResult]  # (pair index, arm: k or 0) -> the block's trial


def measure_paired(
    concurrency: int,
    k: int,
    block: BlockFn,
    *,
    threshold: float = 1.0,
    confidence: float = 0.95,
    seed: int = 0,
    budget_s: float = DEFAULT_BUDGET_S,
) -> PairedCell:
    """The paired cell ``(concurrency, k)``; see the module docstring."""
    pairs: list[BlockPair] = []
    spent = 0.0
    for i in range(MAX_PAIRS):
        spec_first = i % 2 == 0
        arms = (k, 0) if spec_first else (0, k)
        got = {}
        for arm in arms:
            trial = block(i, arm)
            spent += trial.wall_time_s
            got[arm] = pooled_cell([trial], arm)
        pairs.append(BlockPair(got[k], got[0], spec_first=spec_first))
        if len(pairs) % LOOK_EVERY:
            continue
        estimate = paired_estimate(
            PairedCell(tuple(pairs)), confidence=confidence, looks=LOOKS, seed=seed
        )
        if settled(estimate, threshold) or spent >= budget_s:
            break
    cell = PairedCell(tuple(pairs))
    assert cell.key == (concurrency, k)
    return cell


class NotSaved(Exception):
    """A block that a resumed run has not measured yet."""


DRIFT_NOTE = 0.10  # an arm whose speed moved more than this within a cell gets a note


def drift_notes(verdicts: Sequence[CellVerdict], choices: Mapping[int, int]) -> list[str]:
    """Notes for paired cells during which either arm's speed moved by more than 10%.

    The pairs absorb a change that hits both arms alike; the note says how much moved and
    whether the cell still settled, so a reader sees why a cell came out ``inconclusive``.
    """
    notes = []
    for v in verdicts:
        est = v.paired
        if est is None:
            continue
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
