"""The report's account of how tune measured: the requests per cell or block, the server, the
intervals, the cells used and the design (:mod:`spectool.tuning.report`)."""

from __future__ import annotations

from collections.abc import Sequence

from spectool.decide.verdict import CellVerdict
from spectool.tuning.outcome import TuneOutcome
from spectool.tuning.side_by_side import servers_lines
from spectool.tuning.trials import BLOCK_WAVES, block_requests


def design_line(verdicts: Sequence[CellVerdict]) -> str:
    """How the cells' two sides were measured, in one line."""
    designs = sorted({v.design for v in verdicts})
    text = {
        "interleaved": "speculative and baseline blocks interleaved on one server (A B, B A, "
        "...), each ratio from pairs measured back to back, blocks added until the interval "
        "is clear of the threshold or the cell's budget is spent",
        "concurrent": "each speculative block and a baseline block started at the same moment "
        "on two identical GPU sets (a server each; a new draft length is a restart of the "
        "speculative server only), blocks added until the interval is clear of the threshold "
        "or the cell's budget is spent",
        "bracketed": "the baseline measured before and after the speculative cells (a new "
        "draft length is a server restart); each interval spans both comparisons",
        "unpaired": "each speculative cell against a baseline measured separately",
    }
    return "; ".join(f"{d}: {text[d]}" for d in designs) + "." if designs else "no cells."


def measurement_section(outcome: TuneOutcome) -> list[str]:
    """The workload, the requests per cell, the server settings, the intervals."""
    resolved = outcome.resolved
    req = resolved.request
    prompts = outcome.prompts
    return [
        "## Measurement",
        "",
        f"- Workload: {prompts.source} ({prompts.format}, {len(prompts.prompts)} prompts, "
        f"id `{prompts.workload_id}`); every request asks for exactly its output length "
        f"(its own, else {resolved.max_tokens} tokens), sampled at temperature "
        f"{req.temperature:g}, top-p {req.top_p:g} unless it sets its own.",
        _cells_line(outcome),
        f"- Server settings: {outcome.setup.server}.",
        f"- Intervals: {req.confidence:.0%} percentile bootstrap ({req.n_boot} resamples): "
        "decode steps in moving blocks for lhs/rhs, requests for latency and throughput.",
        "",
    ]


def _cells_line(outcome: TuneOutcome) -> str:
    """What one cell (unpaired) or one block of a paired cell sends."""
    result, req = outcome.result, outcome.resolved.request
    if any(v.paired is not None for v in result.cells):
        return (
            "- Each paired block: "
            + ", ".join(
                f"c={c}: {block_requests(len(outcome.prompts.prompts), c)} requests"
                for c in result.concurrencies
            )
            + " (two at concurrency 1; above it the whole workload in whole waves of c, at "
            f"least {BLOCK_WAVES}, in a closed loop, the users joining one at a time "
            "as each one's first request has its first token, then draining; the server is "
            "warm, so no warmup); both blocks of a pair send the same prompts."
        )
    return (
        "- Each cell: "
        + ", ".join(
            f"c={c}: {max(outcome.resolved.num_prompts, 2 * c)} requests"
            for c in result.concurrencies
        )
        + f" per trial, after a warmup wave of c requests; {req.repeats} trial(s) per cell, "
        "closed loop (c requests always in flight)."
    )


def runs_section(outcome: TuneOutcome) -> list[str]:
    """Cells used against the full grid, trials, server starts, times, the design."""
    result = outcome.result
    return [
        "## Runs",
        "",
        f"- Cells the decision rests on: **{result.runs_used}** of the full grid's "
        f"{result.full_grid_runs} "
        f"({result.runs_used / result.full_grid_runs:.0%}); measured in this run: "
        f"{len(result.measured_now)}, reused from an earlier run: {len(result.reused)}.",
        f"- Trials measured in this run: {outcome.trials_measured_now}; server starts: "
        f"{outcome.server_starts}; measuring took {outcome.measure_s:.1f} s, the whole run "
        f"{outcome.wall_s:.1f} s.",
        f"- Design: {design_line(result.cells)}",
        *servers_lines(outcome.servers),
        "",
    ]
