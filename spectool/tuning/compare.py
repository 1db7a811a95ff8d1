"""``spectool tune`` over several methods: the same cost inequality per method and concurrency,
then one method to deploy (:mod:`spectool.decide.methods`).

A profile may list ``alternatives`` to its pair (the demo profile: the draft model, an EAGLE-3
head and n-gram lookup). With such a profile and no method, drafter or target given, tune runs
one search per method, each in its own folder ``DIR/<method>/`` with its own server,
``trials.jsonl``, decision and report (``--resume`` continues each). Methods are measured in the
profile's order; every later search gets the ratios the earlier ones chose as its *rival*
(:func:`spectool.decide.tune.tune`): cells its planned cells predict to lose are not confirmed,
so a method that cannot win costs its planned cells only; the roofline prior stands in for its
``k = 1`` cost cell (:mod:`spectool.tuning.prior`), and it reuses the first method's baseline
cells (same target, engine and settings; its paired cells carry their own baseline blocks).

``DIR`` itself then holds the deployment: ``decision.json`` of the chosen method (its schedule)
with a ``methods`` object (every method per concurrency, the winner per concurrency, the chosen
method and why), the chosen method's build files, and a ``report.md`` comparing the methods.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from spectool.decide.cell import CellMeasurement
from spectool.decide.choose import unproven_gain
from spectool.decide.duel import DuelEstimate
from spectool.decide.methods import (
    TIE_MARGIN,
    MethodChoice,
    Rival,
    choose_method,
    closest_rival,
    rival_ratios,
)
from spectool.errors import BadInputError, OutputExistsError
from spectool.io import atomic_write_text
from spectool.methods import serving_cost_rank
from spectool.tuning.outcome import CellKey, TuneOutcome
from spectool.tuning.report import DASH
from spectool.tuning.request import ResolvedTune, TuneRequest, resolve
from spectool.tuning.setup import PLOT_NAMES, REPORT_NAME, has_results
from spectool.tuning.time_spent import TimeSpent, time_markdown, time_spent

DEFAULT_PROFILE = "demo"
DuelFn = Callable[[TuneOutcome, TuneOutcome, Sequence[int]], Sequence[DuelEstimate]]
COMPARISON_NAME = "methods.json"


@dataclass(frozen=True)
class MethodsOutcome:
    """A finished comparison: each method's run, the choice, and the files written in DIR."""

    outcomes: tuple[TuneOutcome, ...]  # in the order measured
    choice: MethodChoice
    out: Path
    files: tuple[Path, ...]
    wall_s: float

    @property
    def chosen(self) -> TuneOutcome:
        return next(o for o in self.outcomes if o.resolved.method == self.choice.chosen)


def method_requests(req: TuneRequest) -> list[TuneRequest]:
    """The requests of a comparison (one per method, each with ``out = DIR/<method>``), or
    ``[req]`` when the request names its pair or method, or its profile has no alternatives."""
    if req.method != "auto" or req.target is not None or req.drafter is not None:
        return [req]
    from spectool.profiles import load_profile

    recipe = load_profile(req.profile or DEFAULT_PROFILE)
    if not recipe.alternatives:
        return [req]
    out = Path(req.out)
    requests = [replace(req, profile=recipe.name, out=out / recipe.method)]
    for alt in recipe.alternatives:
        requests.append(
            replace(
                req,
                profile=None,
                target=recipe.target,
                drafter=alt.drafter,
                method=alt.method,
                max_draft_len=req.max_draft_len or alt.max_draft_len or recipe.max_draft_len,
                out=out / alt.method,
            )
        )
    return requests


def resolve_all(requests: Sequence[TuneRequest]) -> list[ResolvedTune]:
    """Resolve (and check) every method before anything is measured; refuse folders that hold
    an earlier run unless ``--resume`` or ``--force`` says what to do with them."""
    resolved = [resolve(r) for r in requests]
    first = requests[0]
    top = Path(first.out).parent
    if has_results(top) and not first.force:
        raise OutputExistsError(
            top, "holds a single-method tune; pass --force to start over or choose another --out"
        )
    if not (first.resume or first.force):
        for r in requests:
            if has_results(Path(r.out)):
                raise OutputExistsError(
                    Path(r.out),
                    "holds the results of an earlier tune; pass --resume to continue it or "
                    "--force to start over",
                )
    return resolved


def run_methods(
    resolved: Sequence[ResolvedTune],
    run: Callable[[ResolvedTune, Rival | None, Mapping[CellKey, CellMeasurement]], TuneOutcome],
    *,
    on_message: Callable[[str], None] | None = None,
    duel: DuelFn | None = None,
) -> MethodsOutcome:
    """Run ``run(resolved, rival, baselines)`` per method in order (``baselines``: the first
    method's ``k = 0`` cells, the same target on the same engine and settings), then choose and
    write DIR's files. ``duel(a, b, concurrencies)``: head-to-head estimates of two methods'
    chosen cells (:mod:`spectool.tuning.duel`), run when the closest rival of the best method
    is not proven slower; the choice then rests on them."""
    import time

    started = time.perf_counter()
    if len({r.method for r in resolved}) != len(resolved):
        raise BadInputError("tune", "the profile lists a method twice")
    outcomes: list[TuneOutcome] = []
    for number, r in enumerate(resolved, 1):
        if on_message is not None:
            on_message(f"method {number}/{len(resolved)}: {r.method}")
        rival = rival_ratios([o.result for o in outcomes]) if outcomes else None
        baselines = (
            {key: cell for key, cell in outcomes[0].cells.items() if key[1] == 0}
            if outcomes
            else {}
        )
        outcomes.append(run(r, rival, baselines))
    # ties go to the method that costs least to serve (spectool.methods)
    by_cost = sorted(outcomes, key=lambda o: serving_cost_rank(o.resolved.method))
    confidence = resolved[0].request.confidence
    choice = choose_method([o.result for o in by_cost], confidence=confidence)
    rival = closest_rival(choice)
    if duel is not None and rival is not None:
        best = next(o for o in outcomes if o.resolved.method == choice.chosen_estimate)
        other = next(o for o in outcomes if o.resolved.method == rival)
        estimates = duel(best, other, list(choice.concurrencies))
        if estimates:
            choice = choose_method(
                [o.result for o in by_cost], confidence=confidence, duel=estimates
            )
    top = outcomes[0].out.parent
    files = write_comparison(outcomes, choice, top)
    if on_message is not None:
        for path in files:
            on_message(f"wrote {path}")
    return MethodsOutcome(tuple(outcomes), choice, top, tuple(files), time.perf_counter() - started)


def write_comparison(
    outcomes: Sequence[TuneOutcome], choice: MethodChoice, top: Path, *, together: bool = False
) -> list[Path]:
    """DIR's deployment (the chosen method's decision and build, with the comparison in
    ``decision.json``), ``methods.json`` and ``report.md``."""
    from spectool.tuning.deploy import write_deployment
    from spectool.tuning.joint import out_raced_lines

    chosen = next(o for o in outcomes if o.resolved.method == choice.chosen)
    spent = time_spent({o.resolved.method: o.out for o in outcomes})
    deployment = write_deployment(
        chosen.resolved, chosen.result, top, extra={"methods": choice.to_json()}
    )
    files = [deployment.decision_path, *deployment.build_files]
    summary = {
        "chosen": choice.chosen,
        "why": choice.why,
        "methods": {
            o.resolved.method: {
                "out": str(o.out),
                "decision": o.result.to_decision_json(),
                "cells_measured": len(o.result.measured_now) + len(o.result.reused),
                "wall_s": o.wall_s,
                "measured_s": spent.of(o.resolved.method),
            }
            for o in outcomes
        },
        "comparison": choice.to_json(),
        "time": spent.to_json(),
        "design": "together" if together else "one method after another",
    }
    files.append(atomic_write_text(top / COMPARISON_NAME, json.dumps(summary, indent=2) + "\n"))
    files.append(
        atomic_write_text(
            top / REPORT_NAME,
            comparison_markdown(
                outcomes, choice, together=together, raced=out_raced_lines(top), spent=spent
            ),
        )
    )
    return list(dict.fromkeys(files))


def comparison_cell(choice: MethodChoice, method: str, c: int) -> str:
    """``k=4 0.49`` (measured, chosen), ``pred 0.56`` (off, nothing measured there: predicted
    to pay, but not to beat a rival, so not confirmed) or ``off``: one method at one
    concurrency, as tables show it."""
    cell = choice.cells[method][c]
    if cell.k > 0:
        return f"k={cell.k} {cell.ratio:.2f}"
    if cell.measured or cell.predicted is None or cell.predicted >= 1:
        return "off"  # measured and not paying (or not settled), or not predicted to pay
    return f"pred {cell.predicted:.2f}"


def comparison_markdown(
    outcomes: Sequence[TuneOutcome],
    choice: MethodChoice,
    *,
    together: bool = False,
    raced: Sequence[str] = (),
    spent: TimeSpent | None = None,
) -> str:
    """The report a user opens: the method deployed and why first, then per concurrency each
    method's chosen cell and the winner, where the measuring time went (``spent``), every
    method's figures (from its folder) and where each method's own report is."""
    methods = [o.resolved.method for o in outcomes]
    first = outcomes[0]
    chosen = next(o for o in outcomes if o.resolved.method == choice.chosen)
    schedule = dict(sorted(chosen.result.schedule.items())) or "none (speculation off)"
    lines = [
        f"# spectool tune: {', '.join(methods)} compared on {first.result.engine}",
        "",
        f"**Deployed: {choice.chosen}**, draft_len_schedule (batch size -> draft length) "
        f"{schedule}. A schedule switches draft lengths, not methods, so one method is deployed "
        f"with its own schedule. {choice.why}.",
        "",
        "## Comparison",
        "",
        f"Target: `{first.resolved.report.target.ref}`. "
        + (
            "Every method was tuned against the same target without speculation on one server "
            "holding every drafter: at each concurrency the methods' cells were measured "
            "together, in rounds of one block per arm on the same prompts (joint cells, "
            "`joint.jsonl`); "
            if together
            else "Each method was tuned against the same target without speculation on its own "
            "server (paired blocks); "
        )
        + "a cell is the chosen "
        "draft length and its per-token ratio lhs/rhs (below 1 pays), with its 95% interval "
        "(UNCERTAIN: not proven, deployed because its estimate beats off and no tie with off "
        f"is proven: its interval is wider than 1 +- {TIE_MARGIN:.0%}); "
        "`pred`: off, the method's own prediction (not confirmed: it did not promise to beat "
        "a ratio measured for a method before it).",
        "",
        "| concurrency | " + " | ".join(methods) + " | fastest |",
        "|---:|" + "---|" * len(methods) + "---|",
    ]
    for c in choice.concurrencies:
        row = []
        for m in methods:
            cell = choice.cells[m][c]
            uncertain = " UNCERTAIN" if unproven_gain(cell) else ""
            row.append(
                comparison_cell(choice, m, c)
                if cell.k == 0
                else f"k={cell.k} {cell.ratio:.3f} ({cell.ci_low:.3f}-{cell.ci_high:.3f})"
                + uncertain
            )
        lines.append(f"| {c} | " + " | ".join(row) + f" | {choice.winners[c]} |")
    lines += [
        "",
        f"**Deployed: {choice.chosen}.** A schedule switches draft lengths, not methods, so one "
        f"method is deployed with its own schedule. {choice.why}.",
        "",
        "Against the best estimate, each method's score ratio with its interval at the "
        "equivalence test's level: *equivalent* when the interval lies within "
        f"1 +- {TIE_MARGIN:.0%} (a proven tie: the cheapest to serve is deployed), *worse* when "
        "the method is proven slower, *uncertain* otherwise (never read as a tie).",
        "",
        "| method | geometric-mean ratio | vs best | standing | speculates at | cells | blocks (s) "
        "| report |",
        "|---|---:|---|---|---|---:|---:|---|",
    ]
    scores = {s.method: s for s in choice.scores}
    for o in outcomes:
        m = o.resolved.method
        s = scores[m]
        at = ", ".join(map(str, s.speculates_at)) or "nowhere"
        cells = len(o.result.measured_now) + len(o.result.reused)
        vs = (
            DASH
            if s.standing == "best"
            else f"{s.vs_best:.3f} ({s.vs_best_low:.3f}-{s.vs_best_high:.3f})"
        )
        lines.append(
            f"| {m} | {s.mean_ratio:.3f} | {vs} | {s.standing} | {at} | {cells} | "
            f"{_seconds(spent, m)} | [{m}/report.md]({m}/report.md) |"
        )
    if choice.duel:
        lines += [
            "",
            "Head to head ("
            + (
                "the two methods' blocks in the same rounds of a joint cell, or both servers "
                "up where no joint cell held both"
                if together
                else "both methods' servers up, blocks alternating on the same prompts"
            )
            + "; ratio: the first method's time per token over the second's, token-weighted "
            "mean of the pairs, with its standard error):",
            "",
            "| concurrency | methods | k | ratio | log se | pairs | prompts |",
            "|---:|---|---|---:|---:|---:|---|",
        ]
        for est in choice.duel:
            lines.append(
                f"| {est.concurrency} | {est.methods[0]} / {est.methods[1]} | "
                f"{est.ks[0]} / {est.ks[1]} | {est.ratio:.3f} | {est.log_se:.3f} | "
                f"{est.pairs} | {est.prompts_covered}/{est.workload_prompts} |"
            )
    if raced:
        lines += [
            "",
            "Out-raced in a joint cell (out of the two leaders, it left before its own "
            "interval settled):",
            "",
        ]
        lines += [f"- {n}" for n in raced]
    notes = [f"{o.resolved.method}: {n}" for o in outcomes for n in o.result.notes if "rival" in n]
    if notes:
        lines += ["", "Pruned by prediction against a rival (or measured within its error):", ""]
        lines += [f"- {n}" for n in notes]
    if spent is not None:
        lines += time_markdown(spent, methods)
    return "\n".join([*lines, *_figures(outcomes, choice.chosen)]) + "\n"


def _seconds(spent: TimeSpent | None, method: str) -> str:
    """The seconds of ``method``'s speculative blocks, as the methods table shows them."""
    if spent is None or not any(a == method for _, a in spent.seconds):
        return DASH
    return f"{spent.of(method):.0f}"


def _figures(outcomes: Sequence[TuneOutcome], chosen: str) -> list[str]:
    """Every method's figures that were drawn (matplotlib installed), the deployed method's
    first, linked from its folder; the details are in its own report."""
    lines = ["", "## Figures", ""]
    drawn = 0
    for o in sorted(outcomes, key=lambda o: o.resolved.method != chosen):
        m = o.resolved.method
        pngs = [name for name in PLOT_NAMES if (o.out / name).is_file()]
        if not pngs:
            continue
        drawn += len(pngs)
        lines += [f"### {m}{' (deployed)' if m == chosen else ''}: [details]({m}/report.md)", ""]
        lines += [
            f"![{m}: {name.removesuffix('.png').replace('_', ' ')}]({m}/{name})" for name in pngs
        ]
        lines.append("")
    if drawn == 0:
        lines.append("No figures were drawn (they need matplotlib: pip install 'spectool[plots]').")
    return lines
