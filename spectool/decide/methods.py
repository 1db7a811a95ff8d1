"""Which speculation method to deploy when several were tuned: the winner per concurrency, and
the one method a deployment can run.

Each method's search (:func:`spectool.decide.tune.tune`) compares it with the same target on
the same engine without speculation, so at every concurrency a method has a chosen draft length
(0 = off) and, when it speculates, that cell's per-token ratio ``lhs / rhs`` with its interval.
A method that stays off at a concurrency runs the baseline there: ratio 1.0, no uncertainty.

* **Per concurrency** the winner is the speculating method with the lowest ratio; ``none`` when
  no method speculates there.
* **One method to deploy.** A ``draft_len_schedule`` switches draft lengths, never methods, so
  the deployment runs one method with its own schedule. Its score is the geometric mean of its
  ratios over the concurrencies (off = 1.0); the lowest wins. Methods whose score is within
  :data:`TIE_MARGIN` of the best and within ``z`` combined standard errors of it (each cell's
  standard error read from its interval on the log scale, cells independent) are *tied* (wide
  intervals alone do not make a 30% slower method a tie): the tie goes to the first of them in
  the order given, which the caller sorts by what the method costs to serve (memory, moving
  parts). A near-equal pair of methods therefore gives the same answer on every run
  instead of the one that happened to measure faster.

Pure: tune results in, a :class:`MethodChoice` out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

from spectool.decide.result import TuneResult
from spectool.errors import BadInputError

# Methods tie when their scores differ by less than this (relative) AND by less than their
# combined interval: near-equal by the measurements and close enough not to matter.
TIE_MARGIN = 0.05


@dataclass(frozen=True)
class MethodCell:
    """One method at one concurrency: its chosen ``k`` (0 = off) and that cell's ratio."""

    method: str
    concurrency: int
    k: int
    ratio: float
    ci_low: float
    ci_high: float
    verdict: str  # the chosen cell's verdict, "off" when k == 0
    predicted: float | None = None  # off: the best predicted ratio there (None: no prediction)
    measured: bool = True  # off: whether any speculative cell was measured there

    def log_se(self, z: float) -> float:
        """The standard error of ``log(ratio)`` read from the interval (0 when off)."""
        if self.k == 0 or self.ci_low <= 0 or self.ci_high <= 0:
            return 0.0
        return (math.log(self.ci_high) - math.log(self.ci_low)) / (2.0 * z)

    def to_json(self) -> dict[str, object]:
        return {
            "k": self.k,
            "ratio": self.ratio,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "verdict": self.verdict,
            "predicted_ratio": self.predicted,
            "measured": self.measured,
        }


@dataclass(frozen=True)
class MethodScore:
    """A method's geometric-mean ratio over the concurrencies, with its standard error (log)."""

    method: str
    mean_ratio: float
    log_se: float
    speculates_at: tuple[int, ...]


@dataclass(frozen=True)
class MethodChoice:
    """The comparison: cells per method and concurrency, the winners, the method to deploy."""

    methods: tuple[str, ...]
    concurrencies: tuple[int, ...]
    cells: Mapping[str, Mapping[int, MethodCell]]
    winners: Mapping[int, str]  # concurrency -> method, or "none"
    scores: tuple[MethodScore, ...]
    chosen: str
    tied: tuple[str, ...]  # methods not distinguishable from the best score (chosen first)
    why: str

    def to_json(self) -> dict[str, object]:
        """The ``methods`` object of ``decision.json``."""
        return {
            "compared": list(self.methods),
            "chosen": self.chosen,
            "why": self.why,
            "tied": list(self.tied),
            "per_concurrency": [
                {
                    "concurrency": c,
                    "winner": self.winners[c],
                    "methods": {m: self.cells[m][c].to_json() for m in self.methods},
                }
                for c in self.concurrencies
            ],
            "scores": {
                s.method: {"mean_ratio": s.mean_ratio, "log_se": s.log_se} for s in self.scores
            },
        }


def method_cells(result: TuneResult) -> dict[int, MethodCell]:
    """Per concurrency, the chosen cell of one method's search (off: ratio 1.0)."""
    by_key = {(v.concurrency, v.k): v for v in result.cells}
    cells: dict[int, MethodCell] = {}
    for c in result.concurrencies:
        k = result.choices.get(c, 0)
        v = by_key.get((c, k)) if k > 0 else None
        if v is None:
            predicted = [p.ratio for p in result.predictions if p.concurrency == c and p.k > 0]
            best = min(predicted) if predicted else None
            measured = any(v.concurrency == c for v in result.cells)
            cells[c] = MethodCell(result.method, c, 0, 1.0, 1.0, 1.0, "off", best, measured)
        else:
            cells[c] = MethodCell(result.method, c, k, v.ratio, v.ci_low, v.ci_high, str(v.verdict))
    return cells


def rival_ratios(results: Sequence[TuneResult]) -> dict[int, float]:
    """Per concurrency, the best ratio any of ``results`` chose (1.0 where all stay off)."""
    rival: dict[int, float] = {}
    for result in results:
        for c, cell in method_cells(result).items():
            rival[c] = min(rival.get(c, 1.0), cell.ratio)
    return rival


def choose_method(
    results: Sequence[TuneResult], *, confidence: float = 0.95, tie_margin: float = TIE_MARGIN
) -> MethodChoice:
    """Compare the methods' searches (in the caller's order of preference); module docstring."""
    if not results:
        raise BadInputError("tune", "no method was tuned")
    methods = tuple(r.method for r in results)
    if len(set(methods)) != len(methods):
        raise BadInputError("tune", f"a method was tuned twice: {', '.join(methods)}")
    concs = results[0].concurrencies
    if any(r.concurrencies != concs for r in results):
        raise BadInputError("tune", "the methods were tuned at different concurrencies")
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    cells = {r.method: method_cells(r) for r in results}
    winners: dict[int, str] = {}
    for c in concs:
        speculating = [cells[m][c] for m in methods if cells[m][c].k > 0]
        best = min(speculating, key=lambda cell: cell.ratio, default=None)
        winners[c] = "none" if best is None or best.ratio >= 1.0 else best.method
    scores = []
    for m in methods:
        row = [cells[m][c] for c in concs]
        mean_log = sum(math.log(cell.ratio) for cell in row) / len(row)
        se = math.sqrt(sum(cell.log_se(z) ** 2 for cell in row)) / len(row)
        scores.append(
            MethodScore(m, math.exp(mean_log), se, tuple(c.concurrency for c in row if c.k > 0))
        )
    best_score = min(scores, key=lambda s: s.mean_ratio)
    tied = tuple(
        s.method
        for s in scores
        if math.log(s.mean_ratio) - math.log(best_score.mean_ratio)
        <= min(z * math.hypot(s.log_se, best_score.log_se), math.log1p(tie_margin))
    )
    chosen = tied[0]
    return MethodChoice(
        methods=methods,
        concurrencies=concs,
        cells=cells,
        winners=winners,
        scores=tuple(scores),
        chosen=chosen,
        tied=tied,
        why=_why(chosen, tied, scores, winners, concs),
    )


def _why(
    chosen: str,
    tied: Sequence[str],
    scores: Sequence[MethodScore],
    winners: Mapping[int, str],
    concs: Sequence[int],
) -> str:
    by_method = {s.method: s for s in scores}
    others = ", ".join(f"{s.method} {s.mean_ratio:.3f}" for s in scores if s.method != chosen)
    mine = by_method[chosen]
    won = [c for c in concs if winners[c] == chosen]
    text = (
        f"{chosen}: geometric-mean per-token ratio {mine.mean_ratio:.3f} over concurrency "
        f"{_span(concs)} with its own schedule (off counts 1.0)"
        + (f", against {others}" if others else "")
    )
    if not mine.speculates_at:
        return text + "; no method pays anywhere, so the baseline is deployed"
    if won:
        text += f"; fastest at concurrency {_span(won)}"
    if len(tied) > 1:
        text += (
            f"; within {TIE_MARGIN:.0%} of {', '.join(m for m in tied if m != chosen)} and not "
            f"distinguishable from it at this confidence, and the cheapest of them to serve"
        )
    return text


def _span(concs: Sequence[int]) -> str:
    values = sorted(concs)
    return str(values[0]) if len(values) == 1 else ", ".join(map(str, values))
