"""What ``spectool tune`` prints: one method's decision table, or several methods compared
(:mod:`spectool.tuning.compare`), in words and as ``--json``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spectool.tuning.compare import MethodsOutcome
    from spectool.tuning.outcome import TuneOutcome


def summary_json(outcome: TuneOutcome) -> dict[str, Any]:
    result = outcome.result
    return {
        "out": str(outcome.out),
        "decision": result.to_decision_json(),
        "runs": {
            "used": result.runs_used,
            "full_grid": result.full_grid_runs,
            "measured_now": len(result.measured_now),
            "reused": len(result.reused),
            "trials_measured_now": outcome.trials_measured_now,
        },
        "wall_s": outcome.wall_s,
        "measurement": outcome.servers,  # TensorRT-LLM: design, GPU sets, wall time saved
        "files": [str(p) for p in outcome.files],
        "notes": list(outcome.notes),
    }


def render(outcome: TuneOutcome) -> None:
    from rich.table import Table

    from spectool.cli.output import console

    result = outcome.result
    verdicts = {(v.concurrency, v.k): v for v in result.cells}
    table = Table(title=f"spectool tune: {outcome.resolved.method} on {result.engine}")
    for column in ("concurrency", "k", "ratio lhs/rhs", "95% CI", "verdict", "tok/s per user"):
        table.add_column(column, justify="right" if column != "verdict" else "left")
    for c in result.concurrencies:
        k = result.choices[c]
        v = verdicts.get((c, k))
        s = outcome.stats.get((c, k))
        per_user = f"{s.tokens_per_s_per_user.value:.1f}" if s is not None else "-"
        if v is None:
            best = min(
                (x for x in result.cells if x.concurrency == c), key=lambda x: x.ratio, default=None
            )
            note = "off" if best is None else f"off (k={best.k} {best.verdict.replace('_', ' ')})"
            table.add_row(str(c), "0", "-", "-", note, per_user)
        else:
            table.add_row(
                str(c),
                str(k),
                f"{v.ratio:.3f}",
                f"{v.ci_low:.3f}-{v.ci_high:.3f}",
                v.verdict.replace("_", " "),
                per_user,
            )
    console.print(table)
    be = result.break_even_concurrency
    top = max(result.concurrencies)
    console.print(
        f"break-even concurrency: {be}"
        if be is not None
        else f"break-even concurrency: none up to {top} (the server's batch limit is "
        f"{outcome.resolved.max_batch_size}): speculation pays at every concurrency measured"
    )
    console.print(f"decision: {schedule_in_words(result.choices)}")
    console.print(
        "draft_len_schedule (batch size -> draft length): "
        f"{dict(sorted(result.schedule.items())) or 'none (speculation off)'}"
    )
    console.print(
        f"runs: {result.runs_used} cells of the {result.full_grid_runs}-cell grid "
        f"({len(result.measured_now)} measured now, {len(result.reused)} reused); "
        f"{outcome.trials_measured_now} trials; {outcome.wall_s:.0f} s"
    )
    from spectool.tuning.side_by_side import servers_lines

    for line in servers_lines(outcome.servers):  # TensorRT-LLM: design and wall time saved
        console.print(line.removeprefix("- ").replace("**", ""), markup=False)
    for note in outcome.notes:
        console.print(f"note: {note}", markup=False, style="yellow")
    console.print(f"wrote {len(outcome.files)} files to {outcome.out} (report: report.md)")


def methods_json(outcome: MethodsOutcome) -> dict[str, Any]:
    chosen = outcome.chosen
    return {
        "out": str(outcome.out),
        "decision": {**chosen.result.to_decision_json(), "methods": outcome.choice.to_json()},
        "methods": {o.resolved.method: summary_json(o) for o in outcome.outcomes},
        "wall_s": outcome.wall_s,
        "files": [str(p) for p in outcome.files],
    }


def render_methods(outcome: MethodsOutcome) -> None:
    """Per concurrency each method's chosen cell and the fastest; the method deployed, why,
    and its schedule."""
    from rich.table import Table

    from spectool.cli.output import console
    from spectool.tuning.compare import comparison_cell

    choice = outcome.choice
    methods = [o.resolved.method for o in outcome.outcomes]
    engine = outcome.chosen.result.engine
    table = Table(title=f"spectool tune: {len(methods)} methods on {engine}")
    table.add_column("concurrency", justify="right")
    for m in methods:
        table.add_column(m, justify="right")
    table.add_column("fastest")
    for c in choice.concurrencies:
        cells = [comparison_cell(choice, m, c) for m in methods]
        table.add_row(str(c), *cells, choice.winners[c])
    console.print(table)
    console.print(
        "cells: chosen k and per-token ratio lhs/rhs (below 1 pays); pred: off, predicted "
        "ratio (not confirmed: not predicted to beat a method measured before it)",
        style="dim",
    )
    console.print(f"deploy: {choice.why}", markup=False)
    result = outcome.chosen.result
    console.print(f"decision: {choice.chosen}, {schedule_in_words(result.choices)}")
    console.print(
        "draft_len_schedule (batch size -> draft length): "
        f"{dict(sorted(result.schedule.items())) or 'none (speculation off)'}"
    )
    runs = ", ".join(
        f"{o.resolved.method} {len(o.result.measured_now) + len(o.result.reused)}"
        for o in outcome.outcomes
    )
    console.print(f"runs: cells per method: {runs}; {outcome.wall_s:.0f} s")
    for o in outcome.outcomes:
        for note in o.notes:
            console.print(f"note: {o.resolved.method}: {note}", markup=False, style="yellow")
    console.print(
        f"wrote the {choice.chosen} deployment and the comparison to {outcome.out} "
        "(report: report.md, with every method's figures; each method's own run in its folder)"
    )


def schedule_in_words(choices: dict[int, int]) -> str:
    """The per-concurrency choices as a person would say them: runs of equal draft lengths,
    e.g. ``k=4 at concurrency 1-8; speculation off at 16 and above``."""
    concs = sorted(choices)
    parts: list[str] = []
    start = 0
    for i in range(1, len(concs) + 1):
        if i < len(concs) and choices[concs[i]] == choices[concs[start]]:
            continue
        k, low, high = choices[concs[start]], concs[start], concs[i - 1]
        last = i == len(concs)
        if last and start > 0:
            where = f"{low} and above"
        else:
            where = f"{low}" if low == high else f"{low}-{high}"
        parts.append(f"speculation off at {where}" if k == 0 else f"k={k} at concurrency {where}")
        start = i
    return "; ".join(parts)
