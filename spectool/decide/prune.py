"""Pruning by prediction, checked: a cell is left unmeasured only when its prediction interval
says it cannot win, and every prune records how wrong the prediction would have to be.

tune's predictions (:func:`spectool.decide.model.predict_grid`, a step-cost model fitted to the
planned cells) decide two kinds of prune:

* **Against a rival method** (:func:`against_rival`): a method compared after another one
  confirms, at each concurrency, only the draft lengths that could beat the per-token ratio the
  earlier method measured there. A cell predicted at ratio ``p`` against a rival at ``r`` is
  pruned only when even the optimistic end of its 80 % interval, ``p / high``
  (:func:`spectool.predict.interval.could_win`), is no better than ``r``.
* **Against the best rival method's score** (:func:`against_best_method`): a method whose
  score (the geometric mean over the concurrencies that deploys one method,
  :mod:`spectool.decide.methods`) would stay more than the tie margin behind the best earlier
  method's even if every cell it still wants came in at the optimistic end of its interval
  cannot be deployed, nor tie: those cells are not confirmed. Per concurrency a cell may well
  beat the rival there; what a deployment runs is one method at every concurrency.
* **Draft lengths left to prediction** (:func:`left_to_prediction`): the search confirms one
  cell per concurrency; every other ``k`` is decided by its prediction against the chosen
  cell's measured ratio (1.0 when off). These are recorded, not re-measured: see below.

Each prune is a :class:`PruneCheck`: the predicted ratio, what it was compared with, the
**margin** (``1 - against / predicted``: by how much the predicted ratio would have to be too
pessimistic for the decision to change; a predicted 1.31 against a rival's 0.60 needs 54 %) and
the predictor's **measured error** on the same scale (``1 - 1 / high``). A cell whose margin is
under the error could win and is measured (rival prunes), or is flagged (draft lengths).

The error (:data:`MEASURED_HIGH`) is measured, not assumed: each of the 16 recorded brute-force
grids of ``tests/decide/data/demo_grids_n8.json.gz`` in turn gives tune's planned cells, the
model predicts every other cell, and the truth is the other 15 grids pooled
(:func:`spectool.decide.replay.prediction_residuals`). ``high`` is one over the 10th percentile of ``measured /
predicted`` (an 80 % interval's optimistic end), per objective the model's ratio is compared in
(step times for ``steps``, per-request decode time for ``tpot``), rounded outwards;
``tests/decide/test_prune.py`` recomputes it and fails when it drifts. Where no residuals exist
(other objectives: TTFT, E2E, throughput and the tails are not what the model predicts), the
documented fallback is the fixed :data:`FALLBACK_MARGIN` (20 %, the CPU roofline check's worst
error, benchmarks/predict_cpu.py), and the record says it is not measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

from spectool.predict.interval import LEVEL, could_win, residual_band

if TYPE_CHECKING:
    from spectool.decide.model import CellPrediction
    from spectool.decide.verdict import CellVerdict

# One over the 10th percentile of measured / predicted per-token ratio, out of sample on the
# recorded grids (2026-12-04: 0.7037 for steps; tpot 0.8255, and 0.7974 since the prediction
# takes each baseline's prefill stall, 2026-12-05), rounded outwards.
MEASURED_HIGH: dict[str, float] = {"steps": 1.43, "tpot": 1.26}
GRIDS_NAME = "demo_grids_n8.json.gz"
# Where no error was measured: the fixed margin tune used before (a cell predicted to lose by
# less than 20 % is measured).
FALLBACK_MARGIN = 0.20

Kind = Literal["rival", "method", "draft_length"]


@dataclass(frozen=True)
class PredictionError:
    """How much too pessimistic the predictor has been: its optimistic end is ``ratio / high``."""

    high: float
    source: str
    measured: bool

    @property
    def margin(self) -> float:
        """The error on the margins' scale: the share of a predicted ratio it may be too high."""
        return 1.0 - 1.0 / self.high

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "margin": self.margin, "level": LEVEL}


def prediction_error(objective: str) -> PredictionError:
    """The measured error for ``objective`` (module docstring), or the documented fallback."""
    if objective in MEASURED_HIGH:
        return PredictionError(
            MEASURED_HIGH[objective],
            f"out of sample on 16 recorded grids ({GRIDS_NAME}), 80% interval, objective "
            f"{objective}",
            measured=True,
        )
    return PredictionError(
        1.0 / (1.0 - FALLBACK_MARGIN),
        f"no calibration for objective {objective}: fixed {FALLBACK_MARGIN:.0%} fallback",
        measured=False,
    )


def margin_needed(predicted: float, against: float) -> float:
    """By how much ``predicted`` would have to be too high to reach ``against`` (negative: it is
    predicted better already)."""
    return 1.0 - against / predicted


@dataclass(frozen=True)
class PruneCheck:
    """One cell decided by its prediction: measured (``pruned`` False) or not."""

    kind: Kind
    concurrency: int
    k: int
    predicted_ratio: float
    against_ratio: float  # the rival's measured ratio, or the chosen cell's (1.0 when off)
    needed: float  # margin_needed(predicted_ratio, against_ratio)
    error: float  # the predictor's measured error, PredictionError.margin
    pruned: bool

    @property
    def within_error(self) -> bool:
        return self.needed <= self.error

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "within_error": self.within_error}

    def describe(self) -> str:
        what = {
            "rival": "a rival method's",
            "method": "the ratio that would let the method tie the best rival's score:",
        }.get(self.kind, "the chosen cell's")
        return (
            f"c={self.concurrency} k={self.k}: predicted {self.predicted_ratio:.3f} against "
            f"{what} {self.against_ratio:.3f}; {self.needed:.0%} too pessimistic would change "
            f"it (measured error {self.error:.0%})"
        )


def against_rival(
    predictions: Sequence[CellPrediction],
    rival: Mapping[int, float],
    error: PredictionError,
    close_margin: float,
) -> tuple[list[CellPrediction], list[PruneCheck], list[str]]:
    """The cells worth confirming against ``rival`` (those that could win within the interval,
    or within ``close_margin``), a check per cell compared, and a note per concurrency where
    every cell is pruned or where one is kept only because of the predictor's error."""
    high = max(error.high, 1.0 + close_margin)
    kept: list[CellPrediction] = []
    checks: list[PruneCheck] = []
    notes: list[str] = []
    for c in sorted({p.concurrency for p in predictions}):
        at_c = sorted((p for p in predictions if p.concurrency == c), key=lambda p: p.k)
        bar = rival.get(c)
        if bar is None:
            kept += at_c
            continue
        near = [p for p in at_c if could_win(p.ratio, bar, high)]
        kept += near
        for p in at_c:
            need = margin_needed(p.ratio, bar)
            checks.append(
                PruneCheck("rival", c, p.k, p.ratio, bar, need, error.margin, p not in near)
            )
        best = min(at_c, key=lambda p: p.ratio)
        need = margin_needed(best.ratio, bar)
        if not near:
            notes.append(
                f"concurrency {c}: not confirmed, predicted best k={best.k} ratio "
                f"{best.ratio:.3f} against {bar:.3f} measured for a rival method; the "
                f"prediction would have to be {need:.0%} too pessimistic to change that (the "
                f"predictor's measured error: {error.margin:.0%}, {error.source})"
            )
        elif best.ratio > bar * (1.0 + close_margin):
            notes.append(
                f"concurrency {c}: measured though predicted behind a rival method (k={best.k} "
                f"{best.ratio:.3f} against {bar:.3f}, {need:.0%} too pessimistic would change "
                f"that): within the predictor's measured error of {error.margin:.0%}"
            )
    return kept, checks, notes


def against_best_method(
    method: str,
    holds: Mapping[int, float],
    wanted: Mapping[tuple[int, int], float],
    rival_method: str,
    rival_score: float,
    error: PredictionError,
    tie_margin: float,
) -> tuple[bool, list[PruneCheck], list[str]]:
    """Whether ``method`` can still be deployed: ``holds`` is, per concurrency, the ratio its
    measured cells give it now (1.0 when off), ``wanted`` the predicted ratio of each cell
    ``(c, k)`` it would confirm. The bar is the best earlier method's score times ``1 +
    tie_margin``: a method above it is neither the best nor equivalent to it
    (:func:`spectool.decide.methods.choose_method`). ``needed`` is the share by which every
    wanted cell's prediction would have to be too pessimistic, all at once, to bring the score
    to the bar; the cells are pruned when that exceeds the predictor's measured error, i.e.
    when even the interval's optimistic ends leave the method behind. Returns (pruned, a check
    per wanted cell, a note when pruned)."""
    if not wanted:
        return False, [], []
    concs = sorted(holds)
    bar = rival_score * (1.0 + tie_margin)

    def score(shrink: float) -> float:
        per_c = dict(holds)
        for (c, _k), ratio in wanted.items():
            per_c[c] = min(per_c[c], 1.0, ratio * (1.0 - shrink))
        return math.exp(sum(math.log(per_c[c]) for c in concs) / len(concs))

    if score(0.0) <= bar:
        needed = 0.0
    else:
        low, high = 0.0, 1.0  # score(high) -> 0 < bar: bisect the share that reaches the bar
        for _ in range(60):
            mid = (low + high) / 2.0
            low, high = (mid, high) if score(mid) > bar else (low, mid)
        needed = high
    pruned = needed > error.margin
    checks = [
        PruneCheck("method", c, k, r, r * (1.0 - needed), needed, error.margin, pruned)
        for (c, k), r in sorted(wanted.items())
    ]
    if not pruned:
        return False, checks, []
    cells = ", ".join(f"c={c} k={k} ({r:.3f})" for (c, k), r in sorted(wanted.items()))
    return (
        True,
        checks,
        [
            f"not confirmed: {cells}; even with each at the optimistic end of its prediction "
            f"interval, {method}'s score would be {score(error.margin):.3f} against {rival_method}'s "
            f"{rival_score:.3f}, more than the {tie_margin:.0%} tie margin behind that rival method, "
            f"so {method} could be neither deployed nor tied. The predictions would have to be "
            f"{needed:.0%} too pessimistic, all of them, to change that (the predictor's measured "
            f"error: {error.margin:.0%})"
        ],
    )


def left_to_prediction(
    predictions: Sequence[CellPrediction],
    verdicts: Sequence[CellVerdict],
    choices: Mapping[int, int],
    error: PredictionError,
) -> tuple[list[PruneCheck], list[str]]:
    """A check per unmeasured draft length against the chosen cell's measured ratio (1.0 when
    off), and one note: per concurrency the closest, and how many lie within the error."""
    measured = {(v.concurrency, v.k): v for v in verdicts}
    checks: list[PruneCheck] = []
    parts = []
    for c, k_chosen in sorted(choices.items()):
        chosen = measured[(c, k_chosen)].ratio if k_chosen > 0 else 1.0
        others = sorted(
            (p for p in predictions if p.concurrency == c and p.k > 0 and (c, p.k) not in measured),
            key=lambda p: p.k,
        )
        here = [
            PruneCheck(
                "draft_length",
                c,
                p.k,
                p.ratio,
                chosen,
                margin_needed(p.ratio, chosen),
                error.margin,
                True,
            )
            for p in others
        ]
        checks += here
        if here:
            best = min(here, key=lambda x: x.needed)
            parts.append(
                f"c={c}: k={best.k} predicted {best.predicted_ratio:.3f}, {best.needed:.0%}"
            )
    if not parts:
        return checks, []
    close = sum(x.within_error for x in checks)
    return checks, [
        "draft lengths left to prediction, the closest per concurrency against the chosen "
        f"cell's measured ratio (off: 1.0), with how much too pessimistic its prediction would "
        f"have to be to change the choice: {'; '.join(parts)}; {close} of {len(checks)} "
        f"unmeasured draft lengths lie within the predictor's measured error of "
        f"{error.margin:.0%}"
    ]


def pruning_json(error: PredictionError | None, checks: Sequence[PruneCheck]) -> dict[str, object]:
    """The ``pruning`` object of ``decision.json``."""
    return {
        "prediction_error": None if error is None else error.to_json(),
        "rule": "a cell is left unmeasured against a rival only when the optimistic end of its "
        "prediction interval (predicted ratio / high) does not beat the rival's measured ratio, "
        "or when, with every cell it still wants there, the method's score would stay more than "
        "the tie margin behind the best rival method's",
        "checks": [x.to_json() for x in checks],
    }


def pruning_markdown(error: PredictionError | None, checks: Sequence[PruneCheck]) -> list[str]:
    """The report's section: the error used, then per concurrency and kind the closest call."""
    if error is None or not checks:
        return []
    lines = [
        "## Pruned by prediction",
        "",
        f"The predictor's measured error: its ratios have been up to {error.margin:.0%} too "
        f"pessimistic ({error.source}"
        + ("" if error.measured else "; NOT measured")
        + "). Against a rival method a draft length is measured unless even that error would "
        "not let it win; the margin is how much too pessimistic its prediction would have to "
        "be to change the decision (below the error: within it); a method whose score would "
        "stay more than the tie margin behind the best rival method's with every cell it "
        "still wants at that optimistic end confirms none of them. Draft lengths left to "
        "prediction are not measured; those within the error are counted.",
        "",
        "| kind | c | closest k | predicted | against | margin | error | outcome |",
        "|" + "---|" * 8,
    ]
    labels = {"rival": "rival method", "method": "rival's score", "draft_length": "draft length"}
    for kind in labels:
        for c in sorted({x.concurrency for x in checks if x.kind == kind}):
            group = [x for x in checks if x.kind == kind and x.concurrency == c]
            best = min(group, key=lambda x: x.needed)
            pruned = sum(x.pruned for x in group)
            within = sum(x.within_error for x in group if x.pruned)
            outcome = (
                f"{pruned} of {len(group)} k pruned"
                if kind != "draft_length"
                else f"{pruned} k not measured"
            ) + (f", {within} within the error" if within else "")
            lines.append(
                f"| {labels[kind]} | {c} | {best.k} | "
                f"{best.predicted_ratio:.3f} | {best.against_ratio:.3f} | {best.needed:.0%} | "
                f"{best.error:.0%} | {outcome} |"
            )
    return [*lines, ""]


def measured_high(residuals: Sequence[float]) -> float:
    """One over the low end of the residuals' 80 % band (:func:`residual_band`)."""
    return 1.0 / residual_band(residuals, LEVEL)[0]
