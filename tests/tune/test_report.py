"""report.md from recorded data: every section in order, every table well formed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from spectool.decide.stats import cell_stats
from spectool.decide.tune import tune
from spectool.measure.grids import read_grids
from spectool.tuning.outcome import TuneOutcome
from spectool.tuning.report import report_markdown

DEMO_GRIDS = Path(__file__).parents[1] / "decide" / "data" / "demo_grids_n8.json.gz"
SECTIONS = [
    "# spectool tune report",
    "## Decision",
    "## Measurement",
    "## Runs",
    "## Latency and throughput per k x concurrency",
    "### ms per output token (token-weighted TPOT, CI)",
    "### tokens/s per user (CI)",
    "### throughput, output tokens/s (c x tokens per request / E2E, CI)",
    "## The cost inequality per cell",
    "## Pairs and noise per cell",
    "## Predicted against measured",
    "## Pruned by prediction",
    "## Acceptance per position",
    "## Why acceptance may be low: spectool check's warnings",
    "## Step-cost model",
    "## Figures",
    "## Notes",
]


def demo_outcome(tmp_path: Path) -> TuneOutcome:
    """Tune's search on a recorded demo grid, bracketed by a second grid's baselines, with the
    run's other parts stubbed by the fields the report reads."""
    grids, _, _ = read_grids(DEMO_GRIDS)
    grid, other = grids[0], grids[1]
    concs = sorted({c for c, _ in grid})
    result = tune(
        concs,
        max(k for _, k in grid),
        lambda c, k: grid[(c, k)],
        method="draft_model",
        n_boot=200,
        measure_after=lambda c: other[(c, 0)],
    )
    used = {(v.concurrency, v.k) for v in result.cells} | {(c, 0) for c in concs}
    cells = {key: grid[key] for key in sorted(used)}
    request = SimpleNamespace(confidence=0.95, n_boot=200, repeats=1, temperature=0.0, top_p=1.0)
    report = SimpleNamespace(
        target=SimpleNamespace(ref="demo-target"),
        drafter=SimpleNamespace(ref="demo-drafter"),
        findings=[],
    )
    resolved = SimpleNamespace(
        request=request,
        report=report,
        method="draft_model",
        engine="torch",
        max_tokens=32,
        num_prompts=16,
    )
    (tmp_path / "speedup_heatmap.png").write_bytes(b"png")
    return TuneOutcome(
        result=result,
        resolved=resolved,  # type: ignore[arg-type]
        out=tmp_path,
        setup=SimpleNamespace(server={"max_batch_size": 16}),  # type: ignore[arg-type]
        prompts=SimpleNamespace(
            source="builtin", format="builtin", prompts=[""] * 16, workload_id="w"
        ),  # type: ignore[arg-type]
        cells=cells,
        stats={key: cell_stats(cell, n_boot=200) for key, cell in cells.items()},
        trials_measured_now=len(cells),
        server_starts=3,
        wall_s=12.0,
        measure_s=10.0,
        files=(tmp_path / "decision.json",),
        notes=("a note",),
    )


def test_report_sections_in_order_and_tables_well_formed(tmp_path: Path) -> None:
    text = report_markdown(demo_outcome(tmp_path))
    lines = text.splitlines()
    assert [line for line in lines if line.startswith("#")] == SECTIONS
    assert "![speedup_heatmap.png](speedup_heatmap.png)" in lines
    assert "- a note" in lines
    assert "| 1 | 8 | bracketed | 2 |" in text  # the pairs section has the bracketed cells
    tables = 0
    for i, line in enumerate(lines):
        if line.startswith("|") and not lines[i - 1].startswith("|"):  # a table's header
            tables += 1
            width = line.count("|")
            body = []
            for row in lines[i + 1 :]:
                if not row.startswith("|"):
                    break
                body.append(row)
            assert body[0] == "|" + "---|" * (width - 1)
            assert len(body) > 1, line
            assert all(row.count("|") == width for row in body), line
    # decision, 3 grid tables, inequality, pairs, checks, predicted grid, pruned, acceptance,
    # model
    assert tables == 11
    assert text.endswith("\n") and not text.endswith("\n\n")
