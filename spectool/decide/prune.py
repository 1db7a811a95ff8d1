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
  beat the rival there; what a deployment runs is one method at every concurrency. A cell at a
  concurrency where the method measured a draft length is judged beside it
  (:func:`neighbour_bound`, the ranking error below), the others on their own.
* **Draft lengths left to prediction** (:func:`worth_measuring`, :func:`left_to_prediction`):
  the search confirms one cell per concurrency; every other ``k`` is judged by its prediction
  *scaled by its nearest measured neighbour's* (:func:`calibrated`: the model's error at one
  draft length is mostly shared by the next, the machine's and the prompts' part of it) against
  the chosen cell's measured ratio (1.0 when off), with the **ranking error** (below). Where
  the best such ``k`` could beat the chosen cell by more than the tie margin within that error,
  it is measured (one per concurrency); the others are recorded with their margins.

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

The **ranking error** (:data:`RANKING_HIGH`) is the same statistic for draft lengths judged
against a measured neighbour: ``log(truth(k) / truth(k_m)) - log(predicted(k) /
predicted(k_m))`` over every unmeasured ``k`` of the interleaved tune runs of 2026-12-05
against the method sweeps of the same workloads (``tests/decide/data/k_ranking.json.gz``,
written by ``benchmarks/predictions_vs_sweep.py --write-ranking``; :func:`ranking_residuals`),
``k_m`` the nearest measured ``k`` at that concurrency (15 runs, 395 draft lengths). At batch 1
the model is 10% too pessimistic about a neighbour in one case of ten (about its middle draft
lengths: the mean is 4%), batched 5%; shipped rounded outwards (11% and 5%), and
``tests/decide/test_prune.py`` recomputes them. The absolute error above is wider (21% for
``tpot``): it holds the machine's drift between the plan and the cells, which a measured
neighbour shares.
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
# One over the 10th percentile of the ranking residuals (module docstring), at batch 1 and
# batched, rounded outwards.
RANKING_HIGH: dict[str, float] = {"batch1": 1.12, "batched": 1.05}
RANKING_NAME = "k_ranking.json.gz"


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


def ranking_class(concurrency: int) -> str:
    """Which ranking error a concurrency's draft lengths take: ``batch1`` or ``batched``."""
    return "batch1" if concurrency <= 1 else "batched"


def ranking_error(concurrency: int) -> PredictionError:
    """The predictor's error on a draft length against a measured neighbour (module docstring)."""
    kind = ranking_class(concurrency)
    return PredictionError(
        RANKING_HIGH[kind],
        f"against a measured neighbour k, out of sample on the 2026-12-05 method sweeps "
        f"({RANKING_NAME}), 80% interval, {'batch 1' if kind == 'batch1' else 'batched'}",
        measured=True,
    )


def _nearest(ks: Sequence[int], k: int) -> int:
    return min(ks, key=lambda m: (abs(m - k), m))


def calibrated(
    predictions: Sequence[CellPrediction], measured: Mapping[tuple[int, int], float]
) -> dict[tuple[int, int], float]:
    """Per unmeasured ``(c, k > 0)`` at a concurrency with a measured speculative cell: its
    predicted ratio times ``measured / predicted`` of the nearest measured ``k`` there (ties:
    the shorter). ``measured``: the measured cells' ratios."""
    pred = {(p.concurrency, p.k): p.ratio for p in predictions if p.k > 0}
    out: dict[tuple[int, int], float] = {}
    for (c, k), ratio in pred.items():
        near = [m for (c2, m) in measured if c2 == c and m > 0 and (c, m) in pred]
        if (c, k) in measured or not near:
            continue
        m = _nearest(near, k)
        out[(c, k)] = ratio * measured[(c, m)] / pred[(c, m)]
    return out


def worth_measuring(
    predictions: Sequence[CellPrediction],
    verdicts: Sequence[CellVerdict],
    choices: Mapping[int, int],
    *,
    tie_margin: float,
    close_margin: float,
    shorter: bool,
) -> tuple[list[tuple[int, int]], list[PruneCheck]]:
    """The draft lengths to measure before deciding: per concurrency, among the unmeasured
    ``k`` a schedule could write there (at most the smallest concurrency's choice above it),
    those whose :func:`calibrated` prediction could beat the chosen cell's measured ratio (1.0
    when off) by more than ``tie_margin`` within the :func:`ranking_error`; of them the best
    predicted (``shorter``: the shortest within ``close_margin`` of it, as
    :func:`~spectool.decide.search.confirmation_cells`). One per concurrency, with a check."""
    measured = {(v.concurrency, v.k): v.ratio for v in verdicts}
    scaled = calibrated(predictions, measured)
    concs = sorted(choices)
    wanted: list[tuple[int, int]] = []
    checks: list[PruneCheck] = []
    for c in concs:
        limit = None if c == concs[0] else choices[concs[0]]
        chosen = measured[(c, choices[c])] if choices[c] > 0 else 1.0
        against = chosen * (1.0 - tie_margin)
        error = ranking_error(c)
        near = {
            k: r
            for (c2, k), r in scaled.items()
            if c2 == c
            and (limit is None or k <= limit)
            and margin_needed(r, against) <= error.margin
        }
        if not near:
            continue
        best = min(near.values())
        if shorter:  # the shortest within close_margin of the best
            k = min(k for k, r in near.items() if r <= best * (1.0 + close_margin))
        else:
            k = min(near, key=lambda k: (near[k], k))
        wanted.append((c, k))
        checks.append(
            PruneCheck(
                "draft_length",
                c,
                k,
                near[k],
                against,
                margin_needed(near[k], against),
                error.margin,
                False,
            )
        )
    return wanted, checks


def ranking_residuals(
    truth: Mapping[tuple[str, int, int], float], runs: Sequence[Mapping[str, object]]
) -> dict[str, list[float]]:
    """Per :func:`ranking_class`, ``log(truth(k) / truth(k_m)) - log(predicted(k) /
    predicted(k_m))`` of every unmeasured ``k`` in ``runs`` (records of one method at one
    concurrency in one tune run: ``method``, ``concurrency``, ``predicted`` {k: ratio},
    ``measured`` [k]); ``k_m`` the nearest measured ``k``, ``truth`` the sweep's ratio per
    (method, concurrency, k)."""
    out: dict[str, list[float]] = {"batch1": [], "batched": []}
    for run in runs:
        method, c = str(run["method"]), int(run["concurrency"])  # type: ignore[call-overload]
        pred = {int(k): float(r) for k, r in run["predicted"].items()}  # type: ignore[attr-defined]
        ks = [int(k) for k in run["measured"] if int(k) in pred]  # type: ignore[attr-defined]
        for k, ratio in pred.items():
            if k in ks or not ks or (method, c, k) not in truth:
                continue
            m = _nearest(ks, k)
            if (method, c, m) not in truth:
                continue
            out[ranking_class(c)].append(
                math.log(truth[(method, c, k)] / truth[(method, c, m)]) - math.log(ratio / pred[m])
            )
    return out


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
    errors: Mapping[tuple[int, int], PredictionError] | None = None,
) -> tuple[bool, list[PruneCheck], list[str]]:
    """Whether ``method`` can still be deployed: ``holds`` is, per concurrency, the ratio its
    measured cells give it now (1.0 when off), ``wanted`` the predicted ratio of each cell
    ``(c, k)`` it would confirm, its error in ``errors`` (beside a measured neighbour, the
    :func:`ranking_error`), else ``error``. Pruned when even with every cell at the optimistic
    end of its interval the score stays above the bar, the best earlier method's score times
    ``1 + tie_margin`` (neither the best nor equivalent: :mod:`spectool.decide.methods`).
    ``needed``: the share by which every prediction would have to be too pessimistic, all at
    once, to reach the bar. Returns (pruned, a check per wanted cell, a note when pruned)."""
    if not wanted:
        return False, [], []
    concs = sorted(holds)
    bar = rival_score * (1.0 + tie_margin)
    margins = {key: (errors or {}).get(key, error).margin for key in wanted}

    def score(shrink: Mapping[tuple[int, int], float]) -> float:
        per_c = dict(holds)
        for (c, k), ratio in wanted.items():
            per_c[c] = min(per_c[c], 1.0, ratio * (1.0 - shrink[(c, k)]))
        return math.exp(sum(math.log(per_c[c]) for c in concs) / len(concs))

    if score(dict.fromkeys(wanted, 0.0)) <= bar:
        needed = 0.0
    else:
        low, high = 0.0, 1.0  # score(high) -> 0 < bar: bisect the share that reaches the bar
        for _ in range(60):
            mid = (low + high) / 2.0
            low, high = (mid, high) if score(dict.fromkeys(wanted, mid)) > bar else (low, mid)
        needed = high
    optimistic = score(margins)
    pruned = optimistic > bar
    checks = [
        PruneCheck("method", c, k, r, r * (1.0 - needed), needed, margins[(c, k)], pruned)
        for (c, k), r in sorted(wanted.items())
    ]
    if not pruned:
        return False, checks, []
    cells = ", ".join(f"c={c} k={k} ({r:.3f})" for (c, k), r in sorted(wanted.items()))
    near = sorted({margins[key] for key in wanted if errors and key in errors})
    error_text = f"{error.margin:.0%}" + (
        f"; against a measured neighbour {', '.join(f'{m:.0%}' for m in near)}" if near else ""
    )
    return (
        True,
        checks,
        [
            f"not confirmed: {cells}; even with each at the optimistic end of its prediction "
            f"interval, {method}'s score would be {optimistic:.3f} against {rival_method}'s "
            f"{rival_score:.3f}, more than the {tie_margin:.0%} tie margin behind that rival method, "
            f"so {method} could be neither deployed nor tied. The predictions would have to be "
            f"{needed:.0%} too pessimistic, all of them, to change that (the predictor's measured "
            f"error: {error_text})"
        ],
    )


def neighbour_bound(
    predictions: Sequence[CellPrediction], verdicts: Sequence[CellVerdict]
) -> dict[tuple[int, int], float]:
    """:func:`calibrated` by the measured cells' interval *low* ends: the ranking error holds
    the model's error against a neighbour's truth, not the neighbour's own measurement error,
    so a prune that rests on a neighbour takes its interval's optimistic end."""
    return calibrated(predictions, {(v.concurrency, v.k): v.ci_low for v in verdicts})


def left_to_prediction(
    predictions: Sequence[CellPrediction],
    verdicts: Sequence[CellVerdict],
    choices: Mapping[int, int],
    error: PredictionError,
) -> tuple[list[PruneCheck], list[str]]:
    """A check per unmeasured draft length against the chosen cell's measured ratio (1.0 when
    off), and one note: per concurrency the closest, and how many lie within the error. Where
    the concurrency has a measured speculative cell the prediction is :func:`calibrated` and
    the error the :func:`ranking_error`; elsewhere the raw prediction and ``error``."""
    measured = {(v.concurrency, v.k): v for v in verdicts}
    scaled = calibrated(predictions, {key: v.ratio for key, v in measured.items()})
    checks: list[PruneCheck] = []
    parts = []
    for c, k_chosen in sorted(choices.items()):
        chosen = measured[(c, k_chosen)].ratio if k_chosen > 0 else 1.0
        others = sorted(
            (p for p in predictions if p.concurrency == c and p.k > 0 and (c, p.k) not in measured),
            key=lambda p: p.k,
        )
        here = []
        for p in others:
            ratio = scaled.get((c, p.k), p.ratio)
            margin = ranking_error(c).margin if (c, p.k) in scaled else error.margin
            need = margin_needed(ratio, chosen)
            here.append(PruneCheck("draft_length", c, p.k, ratio, chosen, need, margin, True))
        checks += here
        if here:
            best = min(here, key=lambda x: x.needed)
            parts.append(
                f"c={c}: k={best.k} predicted {best.predicted_ratio:.3f}, {best.needed:.0%} "
                f"(error {best.error:.0%})"
            )
    if not parts:
        return checks, []
    close = sum(x.within_error for x in checks)
    return checks, [
        "draft lengths left to prediction, the closest per concurrency against the chosen "
        f"cell's measured ratio (off: 1.0), its prediction scaled by the nearest measured "
        f"draft length's where there is one, with how much too pessimistic it would have to be "
        f"to change the choice: {'; '.join(parts)}; {close} of {len(checks)} unmeasured draft "
        f"lengths lie within the predictor's measured error (against a measured neighbour: "
        f"{ranking_error(1).margin:.0%} at batch 1, {ranking_error(2).margin:.0%} batched; "
        f"else {error.margin:.0%})"
    ]


def pruning_json(error: PredictionError | None, checks: Sequence[PruneCheck]) -> dict[str, object]:
    """The ``pruning`` object of ``decision.json``."""
    return {
        "prediction_error": None if error is None else error.to_json(),
        "rule": "a cell is left unmeasured against a rival only when the optimistic end of its "
        "prediction interval (predicted ratio / high) does not beat the rival's measured ratio, "
        "or when, with every cell it still wants there, the method's score would stay more than "
        "the tie margin behind the best rival method's; a draft length beside a measured one is "
        "judged by its prediction scaled by that neighbour's, with the error against a "
        "neighbour, and measured (pruned false) where it could beat the choice by more than "
        "the tie margin within it, on servers that switch the draft length in place",
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
        "still wants at that optimistic end confirms none of them. A draft length is "
        "judged by its prediction scaled by its nearest measured neighbour's, with the error "
        "against a measured neighbour; where the best could beat the chosen cell by more than "
        "the tie margin within it, it is measured (one per concurrency); the rest are left to "
        "prediction, those within the error counted.",
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
                else f"{len(group) - pruned} measured for it, {pruned} not"
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
