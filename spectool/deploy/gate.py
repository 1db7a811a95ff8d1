"""The cost gate: serve a build with speculation, or its baseline, and say why in numbers.

Speculative decoding trades spare GPU compute for fewer decoding steps. At high concurrency there
is no spare compute and every drafted token costs real time, so speculation can make each user's
tokens slower. ``spectool serve --speculation auto`` (the default) therefore turns speculation on
only when the build's tune decision supports it:

* **pays at the expected concurrency**: the decision's choice there is ``k > 0`` (a cell whose
  bootstrap interval lies below 1); or
* **the build switches it off under load by itself**: the speculative config carries a runtime
  gate (``draft_len_schedule`` / ``max_concurrency``) that turns speculation off above a batch
  size below the expected concurrency, so the engine speculates only when load is light.

Otherwise the baseline config is served and the reason quotes the measured cell. With no
decision recorded the build is served as built, flagged as unmeasured. With no expected
concurrency the largest measured concurrency is assumed (the costly end). ``on`` and ``off``
force the choice; ``on`` still warns when the decision says speculation does not pay.

Pure: no I/O. Decisions are :class:`spectool.deploy.decision.Decision` objects.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from spectool.deploy.decision import Decision
from spectool.errors import BadInputError

SPECULATION_MODES = ("auto", "on", "off")
Speculation = Literal["auto", "on", "off"]


@dataclass(frozen=True)
class RuntimeGate:
    """What the speculative config does by itself: no speculation above batch ``off_above``."""

    kind: str
    off_above: int


@dataclass(frozen=True)
class GateDecision:
    """Serve with speculation (``speculate``) or the baseline; ``reason`` says why, with the
    measured numbers where there are any; ``warn`` marks reasons the user should act on."""

    speculate: bool
    reason: str
    warn: bool = False
    predicted: bool = False  # the decision came from tune --predict-only


def _labelled(decision: Decision | None, gate: GateDecision) -> GateDecision:
    """A predicted decision's gate says so first: "predicted, not measured: ..."."""
    if decision is None or not decision.predicted:
        return gate
    reason = gate.reason.replace("measured concurrency", "predicted concurrency")
    reason = reason.replace("best measured:", "best predicted:")
    return GateDecision(gate.speculate, f"{decision.label}: {reason}", gate.warn, True)


def _cell_text(decision: Decision, concurrency: int) -> str:
    best = decision.best_cell(concurrency)
    if best is None:
        return f"no speculative cell was measured at concurrency {concurrency}"
    return f"best measured: {best.describe()}"


def _pays_text(decision: Decision, measured_at: int, k: int) -> str:
    cell = decision.cell(measured_at, k)
    if cell is None:
        return f"the decision chose k={k} at concurrency {measured_at}"
    return cell.describe()


def decide_speculation(
    mode: str,
    decision: Decision | None,
    *,
    expected_concurrency: int | None = None,
    runtime_gate: RuntimeGate | None = None,
    expected_rate: float | None = None,
) -> GateDecision:
    """Apply the cost gate (see the module docstring). Raises :class:`BadInputError` for an
    unknown ``mode``, a non-positive ``expected_concurrency`` or ``expected_rate``, both
    given, or a rate with a decision that measured none."""
    if expected_rate is not None:
        if not expected_rate > 0:
            raise BadInputError("--expected-rate", f"must be > 0 req/s, got {expected_rate}")
        if expected_concurrency is not None:
            raise BadInputError("--expected-rate", "give it or --expected-concurrency, not both")
    if mode not in SPECULATION_MODES:
        raise BadInputError(
            "--speculation", f"expected one of {', '.join(SPECULATION_MODES)}, got {mode!r}"
        )
    if expected_concurrency is not None and expected_concurrency < 1:
        raise BadInputError(
            "--expected-concurrency", f"must be 1 or more, got {expected_concurrency}"
        )
    if mode == "off":
        return GateDecision(False, "speculation forced off (--speculation off)")
    if expected_rate is not None and decision is not None:
        gate = _at_rate(decision, expected_rate)
        if isinstance(gate, GateDecision):
            verdict = gate
        else:  # beyond the measured rates: the concurrency Little's law maps it to
            verdict = _auto(decision, gate[0], runtime_gate)
            verdict = dataclasses.replace(verdict, reason=f"{gate[1]}: {verdict.reason}")
        verdict = _labelled(decision, verdict)
    else:
        verdict = _labelled(decision, _auto(decision, expected_concurrency, runtime_gate))
    if mode == "on":
        if verdict.speculate:
            return GateDecision(True, "speculation forced on (--speculation on)")
        return GateDecision(
            True,
            f"speculation forced on (--speculation on) although {verdict.reason}",
            warn=True,
            predicted=verdict.predicted,
        )
    return verdict


def _at_rate(decision: Decision, rate: float) -> GateDecision | tuple[int, str]:
    """The gate at an arrival rate: the measured rate level covering it decides (the users'
    objective, deployed against baseline); beyond the highest measured rate, the concurrency
    the server saw there, scaled by the rate (Little's law, a lower bound: latency grows with
    load), goes to the concurrency gate."""
    if not decision.rates:
        raise BadInputError(
            "--expected-rate",
            "the build's decision measured no arrival rate: rerun spectool tune with "
            "--request-rate, or pass --expected-concurrency",
        )
    objective = decision.rates_objective or "the objective"
    level = decision.rate_level(rate)
    if level is not None:
        text = f"at {rate:.3g} req/s ({level.describe(objective)})"
        if level.verdict == "pays" or (
            level.verdict == "inconclusive" and level.objective_ratio < 1.0
        ):
            proven = "" if level.verdict == "pays" else ", not proven"
            return GateDecision(True, f"speculation pays{proven} {text}")
        return GateDecision(False, f"speculation does not pay {text}; serving the baseline")
    top = max((r for r in decision.rates if not r.trace), key=lambda r: r.rate_per_s, default=None)
    if top is None:
        raise BadInputError(
            "--expected-rate", "the decision holds only a trace replay, no --request-rate level"
        )
    concurrency = max(1, math.ceil(top.in_flight_base * rate / top.rate_per_s))
    return concurrency, (
        f"{rate:.3g} req/s is above the highest measured rate ({top.rate_per_s:.3g} req/s, "
        f"{top.in_flight_base:.1f} in flight): taken as concurrency {concurrency} or more"
    )


def _auto(
    decision: Decision | None, expected: int | None, runtime_gate: RuntimeGate | None
) -> GateDecision:
    if decision is None:
        return GateDecision(
            True,
            "no tune decision recorded in this build: speculation is on but unmeasured here; "
            "run spectool tune and rebuild with --decision",
            warn=True,
        )
    if not decision.speculates_anywhere:
        first = decision.concurrencies[0]
        return GateDecision(
            False,
            "the decision found no measured concurrency where speculation pays "
            f"({_cell_text(decision, first)}); serving the baseline",
        )
    if expected is None:
        concurrency = decision.concurrencies[-1]
        assumed = f"assuming the largest measured concurrency, {concurrency} (pass --expected-concurrency)"
    else:
        concurrency = expected
        assumed = f"at the expected concurrency {concurrency}"
    k = decision.choice_at(concurrency)
    bucket = decision.bucket(concurrency)
    if k > 0 and bucket is not None:
        return GateDecision(True, f"speculation pays {assumed}: {_pays_text(decision, bucket, k)}")
    if bucket is None:
        largest = decision.concurrencies[-1]
        why = (
            f"{assumed} speculation was not measured (largest measured concurrency {largest}; "
            f"{_cell_text(decision, largest)})"
        )
    else:
        why = f"speculation does not pay {assumed} ({_cell_text(decision, bucket)})"
    if runtime_gate is not None and runtime_gate.off_above < concurrency:
        return GateDecision(
            True,
            f"{why}, but the build's {runtime_gate.kind} turns it off above batch size "
            f"{runtime_gate.off_above}, so it only speculates under lighter load",
        )
    return GateDecision(False, f"{why}; serving the baseline")
