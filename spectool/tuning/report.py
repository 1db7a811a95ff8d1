"""``DIR/report.md``: the decision and the evidence for it, for a person to read.

Sections: the decision (draft length per concurrency, break-even, the files written); how it was
measured; runs used against the full grid; per-token latency, per-user tokens/s and throughput
for every measured ``k`` x concurrency with bootstrap intervals; the cost inequality's terms per
cell; predicted against measured; pruned by prediction (:mod:`spectool.decide.prune`); acceptance per position; the fitted step-cost model; notes.
Numbers come from :class:`~spectool.tuning.outcome.TuneOutcome` only; nothing is recomputed here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from spectool.decide.choose import unproven_gain
from spectool.decide.pair_stats import DISTURBED_SDS
from spectool.decide.prune import pruning_markdown
from spectool.decide.stats import Interval, acceptance_curves
from spectool.decide.verdict import TIE_MARGIN, PairedEstimate
from spectool.io import atomic_write_text
from spectool.tuning.outcome import TuneOutcome
from spectool.tuning.report_runs import measurement_section, runs_section
from spectool.tuning.setup import PLOT_NAMES, REPORT_NAME

DASH = "–"


def _iv(interval: Interval, digits: int = 2) -> str:
    return (
        f"{interval.value:.{digits}f} ({interval.low:.{digits}f}{DASH}{interval.high:.{digits}f})"
    )


def _num(value: float | None, digits: int = 2) -> str:
    return DASH if value is None else f"{value:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def _k_name(k: int) -> str:
    return "k=0 (off)" if k == 0 else f"k={k}"


def _grid_table(outcome: TuneOutcome, title: str, cell_text: object) -> list[str]:
    """A k x concurrency table of measured cells (``cell_text(stats) -> str``)."""
    concs = outcome.result.concurrencies
    ks = sorted({k for _, k in outcome.stats})
    rows = []
    for k in ks:
        row = [_k_name(k)]
        for c in concs:
            s = outcome.stats.get((c, k))
            row.append(DASH if s is None else cell_text(s))  # type: ignore[operator]
        rows.append(row)
    return [f"### {title}", "", *_table(["", *(f"c={c}" for c in concs)], rows)]


def _pairs_cell(est: PairedEstimate) -> str:
    """A cell's pairs, with the strata its interval used and the pairs set aside."""
    notes = [f"{est.strata} strata"] if est.strata else []
    notes += [f"{len(est.set_aside)} set aside"] if est.set_aside else []
    return f"{est.pairs} ({', '.join(notes)})" if notes else str(est.pairs)


def _noise_section(outcome: TuneOutcome) -> list[str]:
    """Per cell: design, pairs, their spread, each arm's drift; why a cell is inconclusive."""
    rows = []
    for v in outcome.result.cells:
        est = v.paired
        if est is None:
            rows.append([str(v.concurrency), str(v.k), v.design, *[DASH] * 6])
            continue
        ratios = " ".join(
            f"[{math.exp(d):.3f}]" if i in est.set_aside else f"{math.exp(d):.3f}"
            for i, d in enumerate(est.log_ratios)
        )
        why = DASH
        if v.verdict == "inconclusive":
            wide = (
                "pairs disagree"
                if est.spread > 2 * est.within_se * math.sqrt(est.pairs)
                else "too few tokens"
            )
            why = f"not settled after {est.pairs} pairs ({wide})"
        rows.append(
            [
                str(v.concurrency),
                str(v.k),
                est.design,
                _pairs_cell(est),
                f"{est.prompts_covered}/{est.workload_prompts}" if est.workload_prompts else DASH,
                ratios,
                f"{est.spread:.3f}",
                f"{est.drift_base - 1:+.1%} / {est.drift_spec - 1:+.1%}",
                why,
            ]
        )
    return [
        "## Pairs and noise per cell",
        "",
        "Pair ratios: lhs / rhs of each speculative block against the baseline block beside it; "
        "the cell's ratio is their mean weighted by the baseline's time on their prompts (the "
        "workload's time over its baseline time; by tokens where every block sent the same "
        "prompts). A ratio in brackets was set aside as "
        "disturbed: every block of the cell sent the same prompts (the whole workload), so "
        f"pairs differ by the machine alone, and it lay more than {DISTURBED_SDS:g} standard "
        "deviations of the other pairs from their mean. Strata: pairs that sent the same "
        "prompts (at concurrency 1 every pass sends the same blocks); once each was measured "
        "twice the interval is theirs, with the pairs' spread around their own stratum's mean "
        "as the noise. Prompts: distinct prompts of the workload the pairs sent (they walk "
        "shuffled passes over it and are judged after whole passes). Spread: standard deviation of their logarithms (the prompts' differences and "
        "what the pairing did not cancel). "
        "Drift: each arm's last block against its first (baseline / speculative), the machine's "
        "change of speed while the cell was measured.",
        "",
        *_table(
            [
                "c",
                "k",
                "design",
                "pairs",
                "prompts",
                "pair ratios",
                "spread",
                "drift",
                "inconclusive",
            ],
            rows,
        ),
    ]


def report_markdown(outcome: TuneOutcome) -> str:
    """The report's text (see the module docstring): its sections in order."""
    sections = (
        _title,
        _decision_section,
        measurement_section,
        runs_section,
        _latency_section,
        _inequality_section,
        _noise_section,
        _predictions_section,
        _pruning_section,
        _acceptance_section,
        check_warnings_section,
        _model_section,
        _figures_section,
        _notes_section,
    )
    lines = [line for section in sections for line in section(outcome)]
    return "\n".join(lines).rstrip() + "\n"


def _title(outcome: TuneOutcome) -> list[str]:
    result, resolved = outcome.result, outcome.resolved
    report = resolved.report
    drafter = report.drafter.ref if report.drafter is not None else "(none)"
    return [
        "# spectool tune report",
        "",
        f"Target `{report.target.ref}`, drafter `{drafter}`, method `{resolved.method}`, engine "
        f"`{resolved.engine}`, draft lengths searched 0..{result.searched_max_draft_len}, "
        f"concurrencies {', '.join(map(str, result.concurrencies))}.",
        "",
    ]


def _decision_section(outcome: TuneOutcome) -> list[str]:
    """The choice per concurrency, then break-even, the schedule, the rule and the files."""
    return ["## Decision", "", *_decision_table(outcome), *_decision_notes(outcome)]


def _decision_table(outcome: TuneOutcome) -> list[str]:
    result = outcome.result
    verdicts = {(v.concurrency, v.k): v for v in result.cells}
    rows = []
    for c in result.concurrencies:
        k = result.choices[c]
        base = outcome.stats.get((c, 0))
        chosen = outcome.stats.get((c, k))
        v = verdicts.get((c, k))
        ratio = DASH if v is None else f"{v.ratio:.3f} ({v.ci_low:.3f}{DASH}{v.ci_high:.3f})"
        verdict = "baseline" if v is None else v.verdict.replace("_", " ")
        if v is not None and unproven_gain(v):
            verdict = "UNCERTAIN: deployed on its estimate"
        speed = DASH
        if base is not None and chosen is not None:
            speed = (
                f"{chosen.tokens_per_s_per_user.value:.1f} vs "
                f"{base.tokens_per_s_per_user.value:.1f}"
            )
        rows.append(
            [str(c), str(k), ratio, verdict, speed, str(result.predicted_choices.get(c, DASH))]
        )
    header = [
        "concurrency",
        "chosen k",
        "ratio lhs/rhs (CI)",
        "verdict",
        "tokens/s per user (chosen vs off)",
        "predicted k",
    ]
    return _table(header, rows)


def _decision_notes(outcome: TuneOutcome) -> list[str]:
    result = outcome.result
    be = result.break_even_concurrency
    if result.schedule:
        schedule = "`" + str(dict(sorted(result.schedule.items()))) + "`"
    else:
        schedule = "none: speculation pays nowhere, so no speculation is written"
    gate = (
        f"; as `max_draft_len` + `max_concurrency`: {result.gate.max_draft_len} up to "
        f"{result.gate.max_concurrency}."
        if result.gate is not None
        else "."
    )
    return [
        f"- Break-even concurrency: **{be if be is not None else 'none measured'}** "
        + (
            "(speculation is off from here on)."
            if be is not None
            else "(speculation still pays at the largest concurrency measured)."
        ),
        f"- `draft_len_schedule` ({result.schedule_semantics} semantics): " + schedule + gate,
        "- Rule: at each concurrency the draft length whose whole "
        f"{outcome.resolved.request.confidence:.0%} interval of lhs/rhs lies below 1 (`pays`) "
        "with the best measured step cost per confirmed token; where the budget ran out "
        "before an interval cleared 1 (`inconclusive`), a cell whose estimate beats off is "
        "deployed on its estimate and marked UNCERTAIN, unless its interval lies within "
        f"1 +- {TIE_MARGIN:.0%} (a proven tie with off: off is as fast and cheaper to serve); "
        "0 when no cell does either. No choice may exceed the one at the smallest "
        "concurrency (TensorRT-LLM's schedule starts with max_draft_len), so the writable set "
        "with the best sum of ratios over concurrencies is chosen; only there, at the smallest "
        "concurrency, may an inconclusive cell be kept, when it lets larger concurrencies use "
        "cells that pay (a note says so).",
        "",
        "Files: " + ", ".join(f"`{Path(p).name}`" for p in outcome.files) + ".",
        "",
    ]


def _latency_section(outcome: TuneOutcome) -> list[str]:
    """Per-token latency, per-user tokens/s and throughput: one k x concurrency table each."""
    return [
        "## Latency and throughput per k x concurrency",
        "",
        "Measured cells only (a dash: not measured, the model predicted it is not the best).",
        "",
        *_grid_table(
            outcome,
            "ms per output token (token-weighted TPOT, CI)",
            lambda s: _iv(s.ms_per_token),
        ),
        *_grid_table(outcome, "tokens/s per user (CI)", lambda s: _iv(s.tokens_per_s_per_user, 1)),
        *_grid_table(
            outcome,
            "throughput, output tokens/s (c x tokens per request / E2E, CI)",
            lambda s: _iv(s.throughput_tokens_per_s, 1),
        ),
    ]


def _inequality_section(outcome: TuneOutcome) -> list[str]:
    """The cost inequality's terms, ratio, interval and speedups per speculative cell."""
    rows = [
        [
            str(v.concurrency),
            str(v.k),
            f"{v.lhs_ms_per_token:.3f}",
            f"{v.rhs_ms_per_token:.3f}",
            f"{v.ratio:.3f}",
            f"{v.ci_low:.3f}{DASH}{v.ci_high:.3f}",
            "tie with off (proven)" if v.tie_with_off else v.verdict.replace("_", " "),
            v.source,
            _num(v.tokens_per_step_measured),
            _num(v.tokens_per_step_predicted),
            _num(v.step_cost_ratio, 3),
            _num(v.predicted_speedup, 3),
            f"{v.measured_speedup:.3f}",
        ]
        for v in outcome.result.cells
    ]
    header = [
        "c",
        "k",
        "lhs ms",
        "rhs ms",
        "ratio",
        "CI",
        "verdict",
        "from",
        "tokens/step meas.",
        "tokens/step pred.",
        "step cost ratio",
        "speedup pred.",
        "speedup meas.",
    ]
    return [
        "## The cost inequality per cell",
        "",
        "lhs = (t_draft + t_verify + t_coord) / confirmed tokens, rhs = decode time per token "
        "without speculation at the same concurrency, both in ms per token.",
        "",
        *_table(header, rows),
    ]


def _predictions_section(outcome: TuneOutcome) -> list[str]:
    """Measured cells against their predictions, then the predicted ratio of every cell."""
    result = outcome.result
    concs = result.concurrencies
    lines = ["## Predicted against measured", ""]
    if result.checks:
        rows = [
            [
                str(p.concurrency),
                str(p.k),
                f"{p.predicted_ratio:.3f}",
                f"{p.measured_ratio:.3f}",
                f"{p.ci_low:.3f}{DASH}{p.ci_high:.3f}",
                "yes" if p.ci_low <= p.predicted_ratio <= p.ci_high else "no",
            ]
            for p in result.checks
        ]
        lines += _table(
            ["c", "k", "predicted ratio", "measured ratio", "measured CI", "prediction in CI"],
            rows,
        )
    else:
        lines += ["No predictions (nothing to predict from): the full grid was measured.", ""]
    if result.predictions:
        pred = {(p.concurrency, p.k): p for p in result.predictions}
        ks = range(1, result.searched_max_draft_len + 1)
        rows = [
            [f"k={k}", *(f"{pred[(c, k)].ratio:.3f}" if (c, k) in pred else DASH for c in concs)]
            for k in ks
        ]
        lines += [
            "Predicted ratio for every cell of the grid (below 1: speculation predicted to pay):",
            "",
            *_table(["", *(f"c={c}" for c in concs)], rows),
        ]
    return lines


def _pruning_section(outcome: TuneOutcome) -> list[str]:
    result = outcome.result
    return pruning_markdown(result.prediction_error, result.prune_checks)


def _acceptance_rows(outcome: TuneOutcome) -> list[list[str]]:
    """Per speculative cell its tokens per step and ``alpha_i``, with a ``pooled`` row per
    concurrency of several cells (as the acceptance plot pools them), padded to one width."""
    rows = []
    for (c, k), s in sorted(outcome.stats.items()):
        if k > 0 and s.alphas is not None:
            rows.append([str(c), str(k), _num(s.tokens_per_step), *(f"{a:.3f}" for a in s.alphas)])
    curves, per_position = acceptance_curves(outcome.cells)
    for c, alphas in sorted(curves.items()):
        ks = [k for (c2, k), s in outcome.stats.items() if c2 == c and k > 0 and s.alphas]
        if per_position and len(ks) > 1:  # the plot pools a concurrency's cells: so does a row
            rows.append([str(c), "pooled", DASH, *(f"{a:.3f}" for a in alphas)])
    rows.sort(key=lambda r: (int(r[0]), r[1] == "pooled"))
    width = max((len(r) for r in rows), default=0)
    return [r + [DASH] * (width - len(r)) for r in rows]


def _acceptance_section(outcome: TuneOutcome) -> list[str]:
    rows = _acceptance_rows(outcome)
    lines = ["## Acceptance per position", ""]
    if not rows:
        return lines + [
            "The engine reports no per-position counts; a constant acceptance rate was fitted "
            "to the measured tokens per step.",
            "",
        ]
    width = len(rows[0]) - 3
    return lines + [
        "alpha_i = P(position i accepted | positions before it accepted); E[tokens | k] = "
        "1 + sum over i <= k of alpha_1 x ... x alpha_i. Rows `pooled` pool a concurrency's "
        "cells, as the acceptance plot draws them.",
        "",
        *_table(["c", "k", "tokens/step", *(f"alpha_{i + 1}" for i in range(width))], rows),
    ]


def _model_section(outcome: TuneOutcome) -> list[str]:
    """The fitted step-cost model's terms."""
    model = outcome.result.cost_model
    lines = ["## Step-cost model", ""]
    if model is None:
        return lines + ["Not fitted (no step times or acceptance were measured).", ""]
    terms = [
        model.fixed_ms,
        model.per_request_ms,
        model.spec_fixed_ms,
        model.per_draft_token_ms,
        model.per_draft_pass_ms,
    ]
    return lines + [
        "t_step(b, k) = fixed + per_request x b + [k > 0] x (spec_fixed + per_draft_token "
        "x b x k + per_draft_pass x k), in ms, fitted by non-negative least squares to "
        f"{model.n_observations} cells (rms residual {model.rms_residual_ms:.3f} ms):",
        "",
        *_table(
            ["fixed", "per_request", "spec_fixed", "per_draft_token", "per_draft_pass"],
            [[f"{t:.4f}" for t in terms]],
        ),
        f"Terms the measured cells could identify: {', '.join(model.fitted)}.",
        "",
    ]


def _figures_section(outcome: TuneOutcome) -> list[str]:
    figures = [f"![{name}]({name})" for name in PLOT_NAMES if (outcome.out / name).is_file()]
    return ["## Figures", "", *figures, ""]


def _notes_section(outcome: TuneOutcome) -> list[str]:
    if not outcome.notes:
        return []
    return ["## Notes", "", *(f"- {n}" for n in outcome.notes), ""]


def write_report(outcome: TuneOutcome) -> Path:
    """Write ``DIR/report.md`` atomically; returns its path."""
    return atomic_write_text(outcome.out / REPORT_NAME, report_markdown(outcome))


def check_warnings_section(outcome: TuneOutcome) -> list[str]:
    """``spectool check``'s warnings on this pair, repeated beside the measured acceptance so a
    low figure is explained where it is seen (README "Why acceptance is low")."""
    warnings = [f for f in outcome.resolved.report.findings if f.severity.value == "warning"]
    lines = ["## Why acceptance may be low: spectool check's warnings", ""]
    if not warnings:
        return lines + ["spectool check raised no warning on this pair.", ""]
    for f in warnings:
        where = f" (`{f.file}`)" if f.file else ""
        lines.append(f"- `{f.code}`{where}: {f.message}")
    return lines + [""]
