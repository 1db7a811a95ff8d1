"""Capacity at an SLO: the highest arrival rate each arm sustains, with and without speculation.

The service owner's question before a rollout: "with speculation this server sustains X req/s
at the SLO, without it Y". ``spectool tune --capacity --slo ...`` answers it after the choice,
on the deployment and its baseline (:class:`~spectool.tuning.deployed.Deployed`):

* a **probe** at rate ``r`` is one pair of open-loop blocks, the deployment and the baseline,
  with the same arrivals and prompts (:func:`spectool.tuning.rates.block_config`; every rate
  uses the same random draws, scaled, so neighbouring rates differ by the rate alone); the
  order alternates from probe to probe. An arm *sustains* ``r`` when its block meets the SLO
  (:func:`spectool.decide.slo.meets`: every term's percentile within its limit, every request
  served, and completions keeping pace with arrivals, so an over-saturated server never
  passes);
* the **search** (:func:`search`) starts at ``start`` (the baseline's request rate at the
  smallest concurrency measured, a load it is known to serve), doubles while an arm still
  sustains the rate, halves while an arm fails at the lowest rate tried, then bisects each
  arm's bracket (geometric midpoint of the arm with the widest one) until every bracket is
  within :data:`PRECISION` or :data:`MAX_PROBES` probes are spent. Both arms are measured at
  every probe, so each bracket is narrowed by every probe that falls inside it;
* the **answer** per arm is its bracket: sustains ``lo``, fails at ``hi``.

Probes are saved in ``DIR/capacity/trials.jsonl`` (the search is deterministic given them, so
``--resume`` replays it and measures only what is missing); ``DIR/capacity.json``, a section of
``DIR/report.md`` and ``DIR/capacity.png`` (latency against load for both arms) are written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectool.decide.slo import SloTerm, meets
from spectool.errors import BadInputError
from spectool.io import atomic_write_text
from spectool.measure.trial import TrialResult
from spectool.tuning.rates import RateLevel, arm_summary, block_config

if TYPE_CHECKING:
    from spectool.tuning.request import ResolvedTune
    from spectool.tuning.session import TuneProgress

CAPACITY_DIR = "capacity"
CAPACITY_NAME = "capacity.json"
PLOT_NAME = "capacity.png"
MAX_PROBES = 12
PRECISION = 0.15  # a bracket hi/lo within 1 + this is found
MAX_DOUBLINGS = 10  # never above start x 2^10, never below start / 2^10
SECTION = "## Capacity at the SLO"
ARMS = ("deployed", "baseline")


@dataclass
class Bracket:
    """An arm's capacity so far: sustains ``lo`` (0: none yet), fails at ``hi`` (inf: none)."""

    lo: float = 0.0
    hi: float = math.inf

    def update(self, rate: float, ok: bool) -> None:
        if ok and self.lo < rate < self.hi:
            self.lo = rate
        elif not ok and self.lo < rate < self.hi:
            self.hi = rate

    @property
    def found(self) -> bool:
        return 0 < self.lo and self.hi < math.inf and self.hi <= self.lo * (1 + PRECISION)


@dataclass
class Search:
    """Where the search stands: every probe so far and each arm's bracket."""

    start: float
    probes: list[dict[str, Any]] = field(default_factory=list)
    brackets: dict[str, Bracket] = field(default_factory=lambda: {a: Bracket() for a in ARMS})

    def next_rate(self) -> float | None:
        """The next rate to probe, or None when done (module docstring)."""
        if len(self.probes) >= MAX_PROBES:
            return None
        if not self.probes:
            return self.start
        b = self.brackets
        top, bottom = self.start * 2**MAX_DOUBLINGS, self.start / 2**MAX_DOUBLINGS
        rising = [x for x in b.values() if x.hi == math.inf]
        if rising:
            rate = 2 * max(max(x.lo for x in rising), self.start)
            return rate if rate <= top else None
        falling = [x for x in b.values() if x.lo == 0]
        if falling:
            rate = min(x.hi for x in falling) / 2
            return rate if rate >= bottom else None
        open_ = [x for x in b.values() if not x.found]
        if not open_:
            return None
        widest = max(open_, key=lambda x: x.hi / x.lo)
        return math.sqrt(widest.lo * widest.hi)

    def record(self, rate: float, result: dict[str, dict[str, Any]]) -> None:
        self.probes.append({"rate_per_s": rate, **result})
        for arm in ARMS:
            self.brackets[arm].update(rate, bool(result[arm]["sustained"]))


Probe = Callable[[float, int], dict[str, dict[str, Any]]]  # (rate, probe index) -> per arm


def search(start: float, probe: Probe) -> Search:
    """Run the capacity search from ``start`` with ``probe`` (module docstring)."""
    if not start > 0:
        raise BadInputError("--capacity", f"needs a positive start rate, got {start}")
    state = Search(start)
    while (rate := state.next_rate()) is not None:
        state.record(rate, probe(rate, len(state.probes)))
    return state


def judged(trial: TrialResult, slo: Sequence[SloTerm]) -> dict[str, Any]:
    """One arm's block at a probe: SLO met, each term's observed value, and its summary."""
    ok, seen = meets(trial.records, slo)
    return {"sustained": ok, "observed_ms": seen, **arm_summary([trial])}


def start_rate(resolved: ResolvedTune, out: Path) -> float:
    """The baseline's request rate at the smallest concurrency tune measured (its saved
    trials: concurrency / mean request latency), a load the server is known to carry."""
    from spectool.measure.trial import load_trials

    trials = load_trials(out / "trials.jsonl") if (out / "trials.jsonl").is_file() else {}
    c = min(resolved.concurrencies)
    base = [
        r.e2e_s
        for t in trials.values()
        if t.config.concurrency == c and " none k=0 " in f" {t.config.label} "
        for r in t.records
        if r.ok
    ]
    if not base:
        raise BadInputError("--capacity", f"no baseline measured at concurrency {c} to start from")
    return c / (sum(base) / len(base))


def run_capacity(
    resolved: ResolvedTune,
    choices: dict[int, int],
    out: Path,
    slo: Sequence[SloTerm],
    *,
    measured_in: Path,
    progress: TuneProgress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[Search | None, list[Path]]:
    """The capacity search on the deployment ``choices`` (module docstring). ``measured_in``:
    the folder of the chosen method's trials (where the start rate is read)."""
    from spectool.tuning.deployed import Deployed, deployed_schedule, rebuild

    say = progress.on_message if progress is not None else (lambda _text: None)
    schedule = deployed_schedule(resolved, choices, "--capacity")
    if not schedule:
        say("capacity: speculation is off at every concurrency, nothing to compare")
        return None, []
    start = start_rate(resolved, measured_in)
    burstiness = resolved.request.burstiness
    with Deployed(
        resolved, schedule, out / CAPACITY_DIR, progress=progress, should_stop=should_stop
    ) as server:

        def probe(rate: float, index: int) -> dict[str, dict[str, Any]]:
            say(f"capacity: {rate:.3g} req/s, the deployment and the baseline")
            level = RateLevel(rate, burstiness)
            order = (True, False) if index % 2 == 0 else (False, True)
            got = {d: server.block(block_config(server.plan, level, 0, 0, d), d) for d in order}
            return {"deployed": judged(got[True], slo), "baseline": judged(got[False], slo)}

        state = search(start, probe)
    written = write_capacity(out, state, slo)
    written += rebuild(resolved, out)
    return state, list(dict.fromkeys(written))


def summary(state: Search, slo: Sequence[SloTerm]) -> dict[str, Any]:
    """``capacity.json``'s body: the SLO, each arm's bracket and every probe."""

    def arm(name: str) -> dict[str, Any]:
        b = state.brackets[name]
        return {
            "sustains_req_per_s": b.lo or None,
            "fails_at_req_per_s": None if b.hi == math.inf else b.hi,
            "found": b.found,
        }

    return {
        "slo": [str(t) for t in slo],
        "start_req_per_s": state.start,
        "deployed": arm("deployed"),
        "baseline": arm("baseline"),
        "probes": state.probes,
    }


def sentence(state: Search) -> str:
    """ "With speculation this server sustains X req/s at the SLO, without it Y"."""

    def text(b: Bracket) -> str:
        if b.lo == 0:
            return f"less than {b.hi:.3g} req/s"
        if b.hi == math.inf:
            return f"at least {b.lo:.3g} req/s (the search's ceiling)"
        return f"{b.lo:.3g} req/s (fails at {b.hi:.3g})"

    d, b = state.brackets["deployed"], state.brackets["baseline"]
    return f"With speculation this server sustains {text(d)} at the SLO, without it {text(b)}."


def write_capacity(out: Path, state: Search, slo: Sequence[SloTerm]) -> list[Path]:
    """``capacity.json``, the report's section and (with matplotlib) ``capacity.png``."""
    from spectool.tuning.deployed import add_to_decision, put_report_section

    body = summary(state, slo)
    written = [atomic_write_text(out / CAPACITY_NAME, json.dumps(body, indent=2) + "\n")]
    written += add_to_decision(
        out, {"capacity": {k: body[k] for k in ("slo", "deployed", "baseline")}}
    )
    plot = plot_capacity(state, out / PLOT_NAME)
    written += put_report_section(out, report_lines(state, slo, plotted=plot is not None))
    return written + ([plot] if plot is not None else [])


def report_lines(state: Search, slo: Sequence[SloTerm], plotted: bool = False) -> list[str]:
    lines = [
        SECTION,
        "",
        f"SLO: {', '.join(map(str, slo))} (each term's percentile over a block's requests, "
        "every request served, completions keeping pace with arrivals). Each probe is a pair "
        "of open-loop blocks with the same arrivals, the deployment and the baseline.",
        "",
        sentence(state),
        "",
        "| req/s | deployed | baseline | TPOT p99 ms deployed / baseline | "
        "TTFT p99 ms deployed / baseline | in flight deployed / baseline |",
        "|---:|---|---|---|---|---|",
    ]
    for p in sorted(state.probes, key=lambda p: p["rate_per_s"]):
        d, b = p["deployed"], p["baseline"]

        def word(arm: dict[str, Any]) -> str:
            return "sustained" if arm["sustained"] else "fails"

        def num(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"

        lines.append(
            f"| {p['rate_per_s']:.3g} | {word(d)} | {word(b)} | {num(d['tpot_p99_ms'])} / "
            f"{num(b['tpot_p99_ms'])} | {num(d['ttft_p99_ms'])} / {num(b['ttft_p99_ms'])} | "
            f"{d['in_flight']:.1f} / {b['in_flight']:.1f} |"
        )
    if plotted:
        lines += ["", f"![latency against load]({PLOT_NAME})"]
    return lines


def plot_capacity(state: Search, path: Path) -> Path | None:
    """TPOT and TTFT p99 against the offered rate, both arms (None without matplotlib)."""
    from spectool.tuning.plots import _pyplot, _save

    try:
        plt = _pyplot()
    except ImportError:  # matplotlib is the optional extra spectool[plots]
        return None
    probes = sorted(state.probes, key=lambda p: p["rate_per_s"])
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, metric in zip(axes, ("tpot_p99_ms", "ttft_p99_ms"), strict=True):
        for arm, style in (("deployed", "o-"), ("baseline", "s--")):
            xs = [p["rate_per_s"] for p in probes if p[arm][metric] is not None]
            ys = [p[arm][metric] for p in probes if p[arm][metric] is not None]
            ax.plot(xs, ys, style, label=arm)
        ax.set_xscale("log")
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel(metric.replace("_", " "))
        ax.legend()
    return _save(fig, path)
