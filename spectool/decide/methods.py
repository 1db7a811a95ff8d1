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
  ratios over the concurrencies (off = 1.0); the lowest estimate is the *best*.
* **A tie is proven, never assumed** (two one-sided tests, TOST): a method is *equivalent* to
  the best only when the interval of the ratio of their ratios at level ``1 - 2 * alpha``
  (``alpha = 1 - confidence``; each cell's standard error read from its interval on the log
  scale, cells independent, or the head-to-head estimate) lies within ``1 +- TIE_MARGIN`` at
  *every* concurrency where either speculates, and so does that of their scores. (On the score
  alone, concurrencies where every method is off dilute a difference: on a code workload that
  paid at concurrency 1 only, a draft model 5.6% ahead there was "within 5%" on the mean over
  1, 4 and 16, and the cheaper EAGLE-3 head was deployed at 75% of the best.) It is *worse* when the two-sided
  interval lies wholly above 1, and otherwise *uncertain*: wide intervals are never read as
  equality. Serving cost breaks proven ties only: the deployed method is the first of the best
  and its equivalents in the order given, which the caller sorts by what the method costs to
  serve (memory, moving parts), so a proven near-equal pair gives the same answer on every run.
  Where a rival is uncertain, the better estimate is deployed and the choice is reported as
  uncertain, with the interval that would have had to be narrower.
* **Head to head.** Each method's ratios come from its own window. Where the closest rival of
  the best estimate is not proven slower (:func:`closest_rival`), the caller measures the two
  head to head (:mod:`spectool.decide.duel`: both chosen cells alternating in the same window,
  on the same prompts); at each concurrency it covers, the head-to-head ratio replaces the two
  independent cells in their comparison, and may show the runner-up to be the faster one.

Pure: tune results in, a :class:`MethodChoice` out.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Literal

from spectool.decide.duel import DuelEstimate
from spectool.decide.duel import quantiles as duel_quantiles
from spectool.decide.result import TuneResult
from spectool.decide.verdict import TIE_MARGIN
from spectool.errors import BadInputError

Standing = Literal["best", "equivalent", "worse", "uncertain"]


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
    """A method's geometric-mean ratio over the concurrencies, with its standard error (log),
    and how it stands against the best estimate: ``vs_best`` is its score over the best's,
    ``vs_best_low``/``vs_best_high`` the equivalence test's interval of it (level ``1 - 2 *
    alpha``)."""

    method: str
    mean_ratio: float
    log_se: float
    speculates_at: tuple[int, ...]
    standing: Standing = "best"
    vs_best: float = 1.0
    vs_best_low: float = 1.0
    vs_best_high: float = 1.0

    def to_json(self) -> dict[str, object]:
        return {
            "mean_ratio": self.mean_ratio,
            "log_se": self.log_se,
            "standing": self.standing,
            "vs_best": self.vs_best,
            "vs_best_interval": [self.vs_best_low, self.vs_best_high],
        }


@dataclass(frozen=True)
class MethodChoice:
    """The comparison: cells per method and concurrency, the winners, the method to deploy."""

    methods: tuple[str, ...]
    concurrencies: tuple[int, ...]
    cells: Mapping[str, Mapping[int, MethodCell]]
    winners: Mapping[int, str]  # concurrency -> method, or "none"
    scores: tuple[MethodScore, ...]
    chosen: str
    tied: tuple[str, ...]  # the best and the methods proven equivalent to it (chosen first)
    why: str
    uncertain: tuple[str, ...] = ()  # neither proven equivalent to the best nor worse
    duel: tuple[DuelEstimate, ...] = ()  # head-to-head estimates the comparison used

    @property
    def chosen_estimate(self) -> str:
        """The method with the best estimate (the deployed one may be a cheaper equivalent)."""
        return next(s.method for s in self.scores if s.standing == "best")

    @property
    def certain(self) -> bool:
        """Whether every method was proven equivalent to the best, or worse than it."""
        return not self.uncertain

    def to_json(self) -> dict[str, object]:
        """The ``methods`` object of ``decision.json``."""
        return {
            "compared": list(self.methods),
            "chosen": self.chosen,
            "why": self.why,
            "tied": list(self.tied),
            "uncertain": list(self.uncertain),
            "tie_margin": TIE_MARGIN,
            "per_concurrency": [
                {
                    "concurrency": c,
                    "winner": self.winners[c],
                    "methods": {m: self.cells[m][c].to_json() for m in self.methods},
                }
                for c in self.concurrencies
            ],
            "scores": {s.method: s.to_json() for s in self.scores},
            "head_to_head": [est.to_json() for est in self.duel],
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


@dataclass(frozen=True)
class Rival(Mapping[int, float]):
    """What a method compared after others must beat: per concurrency the best ratio any earlier
    method chose (the mapping; 1.0 where all stay off), and the best earlier method's score
    (``method``, ``score``: the geometric mean of its ratios, off = 1.0, as :func:`choose_method`
    scores a deployment)."""

    ratios: Mapping[int, float]
    method: str
    score: float

    def __getitem__(self, c: int) -> float:
        return self.ratios[c]

    def __iter__(self) -> Iterator[int]:
        return iter(self.ratios)

    def __len__(self) -> int:
        return len(self.ratios)


def method_score(result: TuneResult) -> float:
    """The geometric mean of a method's chosen ratios over its concurrencies (off = 1.0)."""
    cells = method_cells(result).values()
    return math.exp(sum(math.log(cell.ratio) for cell in cells) / len(cells))


def rival_ratios(results: Sequence[TuneResult]) -> Rival:
    """Per concurrency, the best ratio any of ``results`` chose (1.0 where all stay off), and
    the best of ``results`` by score."""
    if not results:
        raise BadInputError("tune", "a rival needs at least one method tuned before")
    ratios: dict[int, float] = {}
    for result in results:
        for c, cell in method_cells(result).items():
            ratios[c] = min(ratios.get(c, 1.0), cell.ratio)
    best = min(results, key=method_score)
    return Rival(ratios, best.method, method_score(best))


def choose_method(
    results: Sequence[TuneResult],
    *,
    confidence: float = 0.95,
    tie_margin: float = TIE_MARGIN,
    duel: Sequence[DuelEstimate] = (),
) -> MethodChoice:
    """Compare the methods' searches (in the caller's order of preference); module docstring.

    ``duel``: head-to-head estimates of two of the methods at some concurrencies
    (:mod:`spectool.decide.duel`); where one covers a concurrency at both methods' chosen
    draft lengths, it replaces the two cells' independent ratios in their comparison.
    """
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

    def gap_at(m: str, ref: str, c: int) -> tuple[float, float]:
        """``log(ratio_m / ratio_ref)`` at ``c`` and its standard error (head to head where
        measured; 0, 0 where both are off)."""
        cm, cr = cells[m][c], cells[ref][c]
        head = _duel_at(duel, c, (m, cm.k), (ref, cr.k))
        if head is not None:
            sign, est = head
            _, two = duel_quantiles(est.dof, confidence)
            return sign * math.log(est.ratio), est.log_se * two / z
        d = math.log(cm.ratio) - math.log(cr.ratio)
        return d, math.sqrt(cm.log_se(z) ** 2 + cr.log_se(z) ** 2)

    def gap(m: str, ref: str) -> tuple[float, float]:
        """``log(score_m / score_ref)`` and its standard error."""
        parts = [gap_at(m, ref, c) for c in concs]
        d_sum = sum(d for d, _ in parts)
        return d_sum / len(concs), math.sqrt(sum(se**2 for _, se in parts)) / len(concs)

    def each(m: str, ref: str) -> list[tuple[float, float]]:
        """The per-concurrency gaps where either method speculates: where an equivalence must
        hold (a concurrency where both are off runs the same baseline)."""
        return [gap_at(m, ref, c) for c in concs if cells[m][c].k > 0 or cells[ref][c].k > 0]

    best_score = min(scores, key=lambda s: s.mean_ratio)
    for s in scores:  # head to head, the runner-up may turn out the faster one
        if s is not best_score and gap(s.method, best_score.method)[0] < 0.0:
            best_score = s
    scores = [
        s
        if s is best_score
        else standing(
            s,
            *gap(s.method, best_score.method),
            confidence,
            tie_margin,
            each=each(s.method, best_score.method),
        )
        for s in scores
    ]
    tied = tuple(s.method for s in scores if s.standing in ("best", "equivalent"))
    uncertain = tuple(s.method for s in scores if s.standing == "uncertain")
    chosen = tied[0]
    return MethodChoice(
        methods=methods,
        concurrencies=concs,
        cells=cells,
        winners=winners,
        scores=tuple(scores),
        chosen=chosen,
        tied=tied,
        why=_why(chosen, tied, uncertain, scores, winners, concs),
        uncertain=uncertain,
        duel=tuple(duel),
    )


def closest_rival(choice: MethodChoice) -> str | None:
    """The method closest to the best estimate that is not proven slower (None: every other
    method is proven slower, or there is none): the one worth measuring head to head."""
    open_ = [s for s in choice.scores if s.standing in ("equivalent", "uncertain")]
    if not open_ or choice.duel:
        return None
    return min(open_, key=lambda s: s.vs_best).method


def _duel_at(
    duel: Sequence[DuelEstimate], c: int, m: tuple[str, int], ref: tuple[str, int]
) -> tuple[int, DuelEstimate] | None:
    """The head-to-head estimate of ``m`` and ``ref`` (method, chosen k) at ``c``, with the
    sign that turns its log ratio into ``log(m / ref)``; None where none was measured."""
    for est in duel:
        if est.concurrency != c:
            continue
        sides = tuple(zip(est.methods, est.ks, strict=True))
        if sides == (m, ref):
            return 1, est
        if sides == (ref, m):
            return -1, est
    return None


def standing(
    score: MethodScore,
    d: float,
    se: float,
    confidence: float,
    tie_margin: float,
    *,
    each: Sequence[tuple[float, float]] | None = None,
) -> MethodScore:
    """``score`` against the best estimate, ``d = log(score / best)`` with standard error
    ``se``: equivalent, worse or uncertain (module docstring). ``each``: the per-concurrency
    ``(log ratio, standard error)`` where either method speculates; equivalence must hold at
    every one of them (an intersection-union test: each at ``alpha``), not only on the mean,
    which concurrencies where both are off would dilute. None: the mean alone."""
    alpha = 1.0 - confidence
    one_sided = NormalDist().inv_cdf(1.0 - alpha)  # TOST: each side at alpha
    two_sided = NormalDist().inv_cdf(1.0 - alpha / 2.0)
    bound = math.log1p(tie_margin)
    low, high = d - one_sided * se, d + one_sided * se
    everywhere = all(
        -bound <= dc - one_sided * sc and dc + one_sided * sc <= bound for dc, sc in each or ()
    )
    if -bound <= low and high <= bound and everywhere:
        verdict: Standing = "equivalent"
    elif d - two_sided * se > 0.0:
        verdict = "worse"
    else:
        verdict = "uncertain"
    return replace(
        score,
        standing=verdict,
        vs_best=math.exp(d),
        vs_best_low=math.exp(low),
        vs_best_high=math.exp(high),
    )


def _why(
    chosen: str,
    tied: Sequence[str],
    uncertain: Sequence[str],
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
        proven = ", ".join(
            f"{m} {by_method[m].vs_best_low:.3f}-{by_method[m].vs_best_high:.3f}"
            for m in tied
            if by_method[m].standing == "equivalent"
        )
        text += (
            f"; proven equivalent to the best within {TIE_MARGIN:.0%} at every concurrency "
            f"where either speculates (score ratio to the best: "
            f"{proven}), and the cheapest of them to serve"
        )
    lower = [s.method for s in scores if s.mean_ratio < mine.mean_ratio and s.method != chosen]
    if lower:
        text += (
            f"; ahead of {', '.join(lower)} by the head-to-head measurement (the same window "
            "and prompts), which replaces the separate runs' ratios where both speculate"
        )
    if uncertain:
        doubt = ", ".join(
            f"{m} {by_method[m].vs_best:.3f} ({by_method[m].vs_best_low:.3f}-"
            f"{by_method[m].vs_best_high:.3f})"
            for m in uncertain
        )
        text += (
            f"; UNCERTAIN: neither equivalent within {TIE_MARGIN:.0%} nor proven slower: "
            f"{doubt} of the best score; the better estimate is deployed"
        )
    return text


def _span(concs: Sequence[int]) -> str:
    values = sorted(concs)
    return str(values[0]) if len(values) == 1 else ", ".join(map(str, values))
