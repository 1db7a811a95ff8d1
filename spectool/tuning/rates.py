"""The deployment at the users' arrival rates: paired open-loop blocks, as deployed vs baseline.

Why: tune chooses ``k`` per concurrency from closed-loop cells, a load that users never send.
Users arrive at a rate, in bursts, with their own lengths, and feel the objective (TPOT by
default) under that traffic. So after the choice, every rate level (``--request-rate``, with
``--burstiness``) and a trace's own timestamps are measured as one paired cell each:

* the speculative arm is the deployment itself: the chosen method with the chosen
  ``draft_len_schedule``, applied by the server at each step's batch size as TensorRT-LLM and
  ``spectool serve`` apply it (:meth:`~spectool.tuning.torch_driver.TorchDriver.serve_deployed`);
  the baseline arm is the same server with speculation off (``k = 0``), switched in place;
* a block sends :func:`block_requests` requests open loop: Poisson (or gamma, ``burstiness``)
  send times drawn from a seed that both arms of a pair share, so the two arms get the same
  arrivals and the same prompts, block by block; a trace's blocks are consecutive windows of
  its requests at their own (scaled) times;
* the pairs walk through shuffled passes over the workload (or through the trace in order) and
  stop by :func:`~spectool.tuning.pairing.measure_paired`'s rule: the objective's paired
  interval clear of 1, or the budget spent;
* the estimate is :func:`~spectool.decide.paired.paired_estimate` of the objective (the
  client's records of both arms), beside each arm's TTFT / TPOT / E2E p50 and p99, its
  throughput and its mean number of requests in flight (Little's law: the summed request
  latency over the blocks' wall time). That number is the concurrency the server sees at that
  rate, and is how ``serve --expected-rate`` maps a rate to the decision.

Blocks are saved in ``DIR/rates/trials.jsonl`` and a resumed run measures only what is missing;
the summary is ``DIR/rates.json`` and a section of ``DIR/report.md``; ``DIR/decision.json``
gains ``rates``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectool.decide.latency import summarize
from spectool.decide.paired import PairedCell, paired_estimate
from spectool.decide.verdict import PairedEstimate
from spectool.errors import BadInputError
from spectool.io import atomic_write_text
from spectool.measure.trial import TrialConfig, TrialResult
from spectool.measure.workloads import Prompt
from spectool.tuning.pairing import measure_paired
from spectool.tuning.trials import CellPlan, pass_order

if TYPE_CHECKING:
    from spectool.tuning.request import ResolvedTune
    from spectool.tuning.session import TuneProgress

RATES_DIR = "rates"
RATES_NAME = "rates.json"
PLOT_NAME = "rates.png"
BLOCK_SECONDS = 4.0  # a Poisson block spans about this much arrival time ...
MIN_BLOCK_REQUESTS = 16  # ... and at least this many requests
TRACE_BLOCK_REQUESTS = 16  # a trace's block: this many consecutive requests


@dataclass(frozen=True)
class RateLevel:
    """One arrival pattern: ``rate_per_s`` Poisson/gamma arrivals, or the trace's own."""

    rate_per_s: float
    burstiness: float = 1.0
    trace: bool = False

    @property
    def name(self) -> str:
        if self.trace:
            return f"trace ({self.rate_per_s:.3g} req/s)"
        shape = "" if self.burstiness == 1.0 else f", burstiness {self.burstiness:g}"
        return f"{self.rate_per_s:g} req/s{shape}"

    @property
    def tag(self) -> str:
        """The level in a trial label (no spaces)."""
        if self.trace:
            return "trace"
        return f"{self.rate_per_s:g}" + ("" if self.burstiness == 1.0 else f"/b{self.burstiness:g}")


def parse_rates(text: str | None) -> tuple[float, ...]:
    """``--request-rate 2,4,8`` as rates in requests per second (each > 0, no repeats)."""
    if text is None or not text.strip():
        return ()
    try:
        rates = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise BadInputError("--request-rate", f"expected rates like 2,4,8, got {text!r}") from None
    if any(not (r > 0 and math.isfinite(r)) for r in rates) or len(set(rates)) != len(rates):
        raise BadInputError("--request-rate", f"rates must be > 0 and distinct, got {text!r}")
    return tuple(sorted(rates))


def rate_levels(
    rates: Sequence[float], burstiness: float, prompts: Sequence[Prompt]
) -> list[RateLevel]:
    """The levels to measure: each rate, then the trace's own arrivals when the prompts carry
    them (a trace workload)."""
    if not burstiness > 0:
        raise BadInputError("--burstiness", f"must be > 0, got {burstiness}")
    levels = [RateLevel(r, burstiness) for r in rates]
    times = [p.arrival_s for p in prompts]
    if times and all(t is not None for t in times):
        span = max(times) - min(times)  # type: ignore[type-var,operator]
        if len(times) < 2 or span <= 0:
            raise BadInputError("--workload", "a trace needs two or more distinct timestamps")
        levels.append(RateLevel((len(times) - 1) / span, trace=True))
    return levels


def block_requests(level: RateLevel, workload_prompts: int) -> int:
    """Requests of one block at ``level`` (see the module docstring)."""
    if level.trace:
        return min(TRACE_BLOCK_REQUESTS, workload_prompts)
    return max(MIN_BLOCK_REQUESTS, math.ceil(level.rate_per_s * BLOCK_SECONDS))


def block_config(
    plan: CellPlan,
    level: RateLevel,
    index: int,
    pair: int,
    deployed: bool,
    arrivals: Sequence[float] = (),
) -> TrialConfig:
    """Block ``deployed`` (else the baseline) of pair ``pair`` at level ``index``.

    Both arms of a pair get the same send times (seed ``[seed, index, pair]`` folded into one
    integer) and the same prompts. ``arrivals``: the trace's send times (s) per prompt.
    """
    w = plan.prompts_in_workload
    n = block_requests(level, w)
    arm = "deployed" if deployed else "k=0"
    method = plan.method if deployed else "none"
    label = f"{plan.engine} {method} {arm} rate={level.tag} #p{pair} setup={plan.fingerprint}"
    common: dict[str, Any] = {
        "label": label,
        "rate_per_s": level.rate_per_s,
        "num_prompts": n,
        "max_tokens": plan.max_tokens,
        "workload_id": plan.workload_id,
        "request": plan.request,
    }
    if level.trace:
        windows = max(1, w // n)
        start = (pair % windows) * n
        order = tuple(range(start, start + n))
        t0 = arrivals[start]
        return TrialConfig(
            **common,
            prompt_indices=order,
            arrivals_s=tuple(max(0.0, arrivals[i] - t0) for i in order),
        )
    first, end = pair * n, (pair + 1) * n
    order = tuple(pass_order(w, 1000 + index, -(-end // w), plan.seed)[first:end])
    seed = (plan.seed * 1_000_003 + index * 10_007 + pair) % (2**31)
    return TrialConfig(**common, prompt_indices=order, burstiness=level.burstiness, seed=seed)


def in_flight(trials: Sequence[TrialResult]) -> float:
    """Mean requests in flight over ``trials`` (Little's law: summed latency / wall time)."""
    busy = sum(r.e2e_s for t in trials for r in t.records if r.ok)
    wall = sum(t.wall_time_s for t in trials)
    return busy / wall if wall > 0 else 0.0


@dataclass(frozen=True)
class RateCell:
    """One level measured: the objective's paired estimate and each arm's own numbers."""

    level: RateLevel
    estimate: PairedEstimate
    pairs: int
    base: dict[str, Any]
    spec: dict[str, Any]
    batch_limit: int = 0  # the server's; more in flight than this means a queue builds

    @property
    def saturated(self) -> bool:
        """More requests in flight without speculation than the server batches: arrivals
        outpace it and a queue builds (latency then grows with the block's length)."""
        return bool(self.batch_limit) and self.base["in_flight"] > self.batch_limit

    def to_json(self) -> dict[str, Any]:
        e = self.estimate
        return {
            "saturated": self.saturated,
            "rate_per_s": self.level.rate_per_s,
            "burstiness": self.level.burstiness,
            "trace": self.level.trace,
            "objective_ratio": e.ratio,
            "ci_low": e.ci_low,
            "ci_high": e.ci_high,
            "verdict": e.verdict,
            "source": e.source,
            "pairs": self.pairs,
            "prompts_covered": e.prompts_covered,
            "workload_prompts": e.workload_prompts,
            "in_flight_base": self.base["in_flight"],
            "in_flight_spec": self.spec["in_flight"],
            "base": self.base,
            "spec": self.spec,
        }


def arm_summary(trials: Sequence[TrialResult]) -> dict[str, Any]:
    """An arm's latency percentiles (ms), throughput and mean requests in flight."""
    records = [r for t in trials for r in t.records]
    wall = sum(t.wall_time_s for t in trials)
    s = summarize(records, duration_s=wall)

    def ms(dist: Any, q: str) -> float | None:
        return None if dist is None else getattr(dist, q) * 1000.0

    return {
        "requests": s.completed,
        "ttft_p50_ms": ms(s.ttft_s, "p50"),
        "ttft_p99_ms": ms(s.ttft_s, "p99"),
        "tpot_p50_ms": ms(s.tpot_s, "p50"),
        "tpot_p99_ms": ms(s.tpot_s, "p99"),
        "e2e_p50_ms": ms(s.e2e_s, "p50"),
        "e2e_p99_ms": ms(s.e2e_s, "p99"),
        "output_tokens_per_s": s.output_tokens_per_s,
        "in_flight": in_flight(trials),
    }


BlockRunner = Callable[[TrialConfig, bool], TrialResult]  # (config, deployed) -> measured trial


def measure_level(
    plan: CellPlan,
    level: RateLevel,
    index: int,
    run_block: BlockRunner,
    *,
    level_key: int,
    k: int,
    arrivals: Sequence[float] = (),
    options: Mapping[str, Any],
) -> RateCell:
    """The paired cell at ``level``; ``run_block`` measures a block (or finds it saved)."""
    got: dict[tuple[int, bool], TrialResult] = {}

    def block(pair: int, arm: int) -> TrialResult:
        deployed = arm > 0
        config = block_config(plan, level, index, pair, deployed, arrivals)
        trial = run_block(config, deployed)
        got[(pair, deployed)] = trial
        return trial

    w = plan.prompts_in_workload
    n = block_requests(level, w)
    passes = max(1, w // n) if level.trace else -(-w // n)
    cell: PairedCell = measure_paired(
        level_key, k, block, pass_pairs=passes, workload_prompts=w, **options
    )
    options = dict(options)
    est = paired_estimate(cell, confidence=options["confidence"], seed=options["seed"])
    pairs = len(cell.pairs)
    base = [got[(i, False)] for i in range(pairs)]
    spec = [got[(i, True)] for i in range(pairs)]
    return RateCell(level, est, pairs, arm_summary(base), arm_summary(spec), level_key)


def stops_paying(cells: Sequence[RateCell]) -> RateCell | None:
    """The lowest Poisson rate where the deployment is proven slower for the objective."""
    lost = [c for c in cells if not c.level.trace and c.estimate.verdict == "does_not_pay"]
    return min(lost, key=lambda c: c.level.rate_per_s) if lost else None


def write_rates(
    out: Path, cells: Sequence[RateCell], *, objective: str, schedule: Mapping[int, int]
) -> list[Path]:
    """``rates.json``, ``decision.json``'s ``rates`` and a section of ``report.md``."""
    from spectool.tuning.deployed import add_to_decision, put_report_section

    lost = stops_paying(cells)
    body = {
        "objective": objective,
        "schedule": {str(b): k for b, k in sorted(schedule.items())},
        "levels": [c.to_json() for c in cells],
        "stops_paying_at_rate": None if lost is None else lost.level.rate_per_s,
    }
    written = [atomic_write_text(out / RATES_NAME, json.dumps(body, indent=2) + "\n")]
    plot = plot_rates(cells, out / PLOT_NAME)
    if plot is not None:
        written.append(plot)
    kept = (
        "rate_per_s",
        "burstiness",
        "trace",
        "objective_ratio",
        "ci_low",
        "ci_high",
        "verdict",
        "in_flight_base",
        "in_flight_spec",
    )
    rates = [{key: c.to_json()[key] for key in kept} for c in cells]
    written += add_to_decision(out, {"rates": rates, "rates_objective": objective})
    lines = report_lines(cells, objective)
    if plot is not None:
        lines += ["", f"![latency against the arrival rate]({PLOT_NAME})"]
    return written + put_report_section(out, lines)


SECTION = "## At your arrival rates"


def _num(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def report_lines(cells: Sequence[RateCell], objective: str) -> list[str]:
    """The report's section: one row per level, objective first."""
    lines = [
        SECTION,
        "",
        f"The deployment (its schedule, applied batch by batch) against the baseline on the same "
        f"server, open-loop arrivals, paired blocks with the same send times and prompts. "
        f"Ratio: deployed / baseline {objective} (below 1 pays), token-weighted over the pairs, "
        "with its interval. In flight: mean requests in the server (Little's law), the "
        "concurrency it sees at that rate.",
        "",
        f"| arrivals | {objective} ratio | interval | verdict | pairs | TPOT p50/p99 ms base | "
        "TPOT p50/p99 ms deployed | E2E p99 ms base / deployed | TTFT p99 ms base / deployed "
        "| in flight base / deployed |",
        "|---|---:|---|---|---:|---|---|---|---|---|",
    ]
    for c in cells:
        e, b, s = c.estimate, c.base, c.spec
        name = c.level.name + (" (saturated)" if c.saturated else "")
        lines.append(
            f"| {name} | {e.ratio:.3f} | {e.ci_low:.3f}-{e.ci_high:.3f} | "
            f"{e.verdict.replace('_', ' ')} | {c.pairs} | "
            f"{_num(b['tpot_p50_ms'])}/{_num(b['tpot_p99_ms'])} | "
            f"{_num(s['tpot_p50_ms'])}/{_num(s['tpot_p99_ms'])} | "
            f"{_num(b['e2e_p99_ms'], '.0f')} / {_num(s['e2e_p99_ms'], '.0f')} | "
            f"{_num(b['ttft_p99_ms'], '.0f')} / {_num(s['ttft_p99_ms'], '.0f')} | "
            f"{b['in_flight']:.1f} / {s['in_flight']:.1f} |"
        )
    lost = stops_paying(cells)
    lines.append("")
    if any(c.saturated for c in cells):
        lines.append(
            "Saturated: more requests in flight without speculation than the server batches; "
            "arrivals outpace it and a queue builds, so latencies there grow with the run."
        )
    if lost is not None:
        lines.append(
            f"Speculation stops paying for {objective} at {lost.level.name} (about "
            f"{lost.base['in_flight']:.1f} requests in flight without it): "
            f"`spectool serve --expected-rate` serves the baseline from there."
        )
    elif cells:
        top = max(cells, key=lambda c: c.level.rate_per_s)
        lines.append(
            f"No measured rate up to {top.level.rate_per_s:.3g} req/s where the deployment is "
            f"proven slower for {objective}."
        )
    return lines


def run_rates(
    resolved: ResolvedTune,
    choices: Mapping[int, int],
    out: Path,
    *,
    progress: TuneProgress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[list[RateCell], list[Path]]:
    """Measure the deployment ``choices`` (k per concurrency) against the baseline at the
    request's rate levels (module docstring); nothing when there are none."""
    from spectool.tuning.deployed import Deployed, deployed_schedule, rebuild
    from spectool.tuning.plan import measurement_plan
    from spectool.tuning.resume import paired_options

    req = resolved.request
    prompts = measurement_plan(resolved)[1]
    levels = rate_levels(req.request_rates, req.burstiness, prompts.prompts)
    say = progress.on_message if progress is not None else (lambda _text: None)
    if not levels:
        return [], []
    schedule = deployed_schedule(resolved, choices, "--request-rate")
    if not schedule:
        say("rate levels: speculation is off at every concurrency, nothing to compare")
        return [], []
    arrivals = [p.arrival_s or 0.0 for p in prompts.prompts]
    cells = []
    with Deployed(
        resolved, schedule, out / RATES_DIR, progress=progress, should_stop=should_stop
    ) as server:
        for i, level in enumerate(levels):
            say(f"arrivals {level.name}: the deployment against the baseline, paired blocks")
            cells.append(
                measure_level(
                    server.plan,
                    level,
                    i,
                    server.block,
                    level_key=resolved.max_batch_size,
                    k=server.k,
                    arrivals=arrivals,
                    options=paired_options(resolved),
                )
            )
    written = write_rates(out, cells, objective=req.objective, schedule=schedule)
    written += rebuild(resolved, out)  # the build in DIR records the decision, now with rates
    return cells, list(dict.fromkeys(written))


def plot_rates(cells: Sequence[RateCell], path: Path) -> Path | None:
    """TPOT p50/p99 and E2E p99 against the arrival rate, both arms (the Poisson levels; None
    without matplotlib or with fewer than one level)."""
    from spectool.tuning.plots import _pyplot, _save

    levels = sorted((c for c in cells if not c.level.trace), key=lambda c: c.level.rate_per_s)
    if not levels:
        return None
    try:
        plt = _pyplot()
    except ImportError:  # matplotlib is the optional extra spectool[plots]
        return None
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    xs = [c.level.rate_per_s for c in levels]
    for arm, style in (("spec", "o-"), ("base", "s--")):
        name = "deployed" if arm == "spec" else "baseline"
        for key, alpha in (("tpot_p50_ms", 1.0), ("tpot_p99_ms", 0.5)):
            ys = [getattr(c, arm)[key] for c in levels]
            axes[0].plot(xs, ys, style, alpha=alpha, label=f"{name} {key[5:8]}")
        axes[1].plot(xs, [getattr(c, arm)["e2e_p99_ms"] for c in levels], style, label=name)
    for ax, label in zip(axes, ("TPOT (ms)", "E2E p99 (ms)"), strict=True):
        ax.set_xlabel("arrival rate (req/s)")
        ax.set_ylabel(label)
        ax.legend(fontsize="small")
    return _save(fig, path)
