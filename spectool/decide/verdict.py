"""What the cost inequality says about one cell: :class:`CellVerdict` (and, for a paired cell,
its :class:`PairedEstimate`), shared by :mod:`spectool.decide.cost` (unpaired) and
:mod:`spectool.decide.paired` (interleaved and bracketed): the types only, so neither module
imports the other's to name them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from spectool.errors import BadInputError

Verdict = Literal["pays", "does_not_pay", "inconclusive"]
# What a ratio compares: the engine's decode steps (``iterations``), or the client's records
# of the requests: time per output token after the first (``requests``, the users' TPOT),
# request latency (``e2e``), time to the first token (``ttft``), or request time per output
# token (``throughput``: in a closed loop throughput is concurrency x tokens / request time),
# or a block's wall time per request that met every SLO (``goodput:<slo>``, vLLM's goodput:
# the source string carries its SLO terms, :func:`goodput_objective`).
Source = Literal["iterations", "requests", "e2e", "ttft", "throughput"] | str

# tune's --objective: the users' metric that decides, and the source it compares
# (``steps``: the engine's decode steps where both blocks have them, else the requests).
OBJECTIVES: dict[str, Source | None] = {
    "tpot": "requests",
    "e2e": "e2e",
    "ttft": "ttft",
    "throughput": "throughput",
    "steps": None,
}
# the tail: ``METRIC@pQ`` compares the Q-th percentile of the per-request metric, both arms'
# blocks pooled (spectool.decide.paired.quantile_estimate); the sources are the means'
QUANTILES: dict[str, float] = {
    f"{name}@p{q}": float(q) for name in ("tpot", "e2e", "ttft") for q in (90, 99)
}
OBJECTIVES.update({name: OBJECTIVES[name.split("@")[0]] for name in QUANTILES})
DEFAULT_OBJECTIVE = "tpot"
GOODPUT = "goodput"


def goodput_objective(slo_text: str) -> str:
    """The objective (and source) ``goodput:<slo>``: requests per second that met every term
    of ``--slo`` (vLLM's ``--goodput``); ``slo_text``: the terms' limits, ``tpot:30ms,...``."""
    return f"{GOODPUT}:{slo_text}"


def objective_source(objective: str) -> Source | None:
    """What ``objective`` compares (None: the steps, iterations where both arms have them);
    an unknown objective is an error naming ``--objective``."""
    if objective.startswith(f"{GOODPUT}:"):
        return objective
    if objective not in OBJECTIVES:
        known = ", ".join([*OBJECTIVES, GOODPUT])
        raise BadInputError("--objective", f"{objective!r} is not one of {known}")
    return OBJECTIVES[objective]


Design = Literal["interleaved", "concurrent", "bracketed", "unpaired"]

# Two configurations (methods, two draft lengths, or a method and off) whose speeds differ by
# less than this fraction are equally fast for spectool's purposes, once that is proven: an
# interval within 1 +- TIE_MARGIN is a tie (the cheaper one to serve is deployed; against off,
# off). An interval wider than that proves nothing; the better estimate is deployed, reported
# uncertain (issue 21: a tie is proven, never assumed; spectool.decide.choose.unproven_gain).
TIE_MARGIN = 0.05


def proven_tie(ci_low: float, ci_high: float, margin: float = TIE_MARGIN) -> bool:
    """Whether the interval of a ratio proves it equivalent to 1: it lies within ``1 +-
    margin`` (two one-sided tests at the interval's level)."""
    return 1.0 - margin <= ci_low and ci_high <= 1.0 + margin


def verdict_for(ci_low: float, ci_high: float) -> Verdict:
    """``pays`` if the interval lies wholly below 1, ``does_not_pay`` if wholly above."""
    if ci_high < 1.0:
        return "pays"
    if ci_low > 1.0:
        return "does_not_pay"
    return "inconclusive"


@dataclass(frozen=True)
class PairedEstimate:
    """The ratio ``lhs / rhs`` of a paired cell with its interval; see the module docstring.

    ``log_ratios`` are the pairs' ``d_i``; ``spread`` their standard deviation (0 with one pair);
    ``within_se`` the sampling noise of their mean. ``drift_base`` / ``drift_spec``: the last
    block's ms per token over the first one's, per arm (1.0 = the machine kept its speed).
    """

    ratio: float
    ci_low: float
    ci_high: float
    verdict: Verdict
    design: Design
    source: Source
    log_ratios: tuple[float, ...]
    spread: float
    within_se: float
    drift_base: float
    drift_spec: float
    confidence: float
    looks: int
    prompts_covered: int = 0  # distinct workload prompts the pairs sent (0: not recorded)
    workload_prompts: int = 0  # prompts in the workload (0: not recorded)
    rest_looks: int = 0  # looks the budget left untaken, spent at the last (paired.look_alpha)
    set_aside: tuple[int, ...] = ()  # pairs set aside as disturbed (pair_stats.disturbed)
    strata: int = 0  # strata of the same prompts the interval used (0: between pairs)

    @property
    def pairs(self) -> int:
        return len(self.log_ratios)

    def to_json(self) -> dict[str, object]:
        return {
            "design": self.design,
            "pairs": self.pairs,
            "pair_ratios": [math.exp(d) for d in self.log_ratios],
            "spread": self.spread,
            "within_se": self.within_se,
            "drift_base": self.drift_base,
            "drift_spec": self.drift_spec,
            "looks": self.looks,
            "rest_looks": self.rest_looks,
            "prompts_covered": self.prompts_covered,
            "workload_prompts": self.workload_prompts,
            "set_aside": list(self.set_aside),
            "strata": self.strata,
        }


@dataclass(frozen=True)
class CellVerdict:
    """The cost inequality evaluated for one cell; see the module docstring for every field.

    ``ci_low``/``ci_high`` bound ``ratio`` at ``confidence``. ``n_spec``/``n_base`` count the
    resampled units (iterations or requests). The ``*_predicted``, ``step_cost_ratio`` and
    ``predicted_speedup`` fields are None where their inputs were not measured.
    """

    concurrency: int
    k: int
    lhs_ms_per_token: float
    rhs_ms_per_token: float
    ratio: float
    ci_low: float
    ci_high: float
    verdict: Verdict
    source: Source
    confidence: float
    n_boot: int
    n_spec: int
    n_base: int
    tokens_per_step_measured: float | None
    tokens_per_step_predicted: float | None
    step_cost_ratio: float | None
    predicted_speedup: float | None
    measured_speedup: float
    paired: PairedEstimate | None = None

    @property
    def design(self) -> str:
        """How the two sides were measured: ``interleaved``, ``bracketed`` or ``unpaired``."""
        return "unpaired" if self.paired is None else self.paired.design

    @property
    def tie_with_off(self) -> bool:
        """Inconclusive, with an interval that proves it as fast as off (:func:`proven_tie`):
        off, cheaper to serve, is deployed in its place (issue 21)."""
        return self.verdict == "inconclusive" and proven_tie(self.ci_low, self.ci_high)

    def to_json(self) -> dict[str, object]:
        """The fields ``decision.json`` lists per cell."""
        out: dict[str, object] = {
            "concurrency": self.concurrency,
            "k": self.k,
            "lhs_ms_per_token": self.lhs_ms_per_token,
            "rhs_ms_per_token": self.rhs_ms_per_token,
            "ratio": self.ratio,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "verdict": self.verdict,
            # inconclusive, its interval within 1 +- TIE_MARGIN: as fast as off, proven (off)
            "tie_with_off": self.tie_with_off,
            "design": self.design,
        }
        if self.paired is not None:
            out.update(self.paired.to_json())
        return out
