"""tune's report repeats check's warnings beside the measured acceptance (issue 28)."""

from __future__ import annotations

from pathlib import Path

from spectool.findings import info, warning
from spectool.tuning.report import report_markdown

from .test_report import demo_outcome


def test_report_repeats_checks_warnings_after_the_acceptance(tmp_path: Path) -> None:
    outcome = demo_outcome(tmp_path)
    outcome.resolved.report.findings = [
        warning(
            "ROPE_MISMATCH",
            "head rope (theta 500000, no rope_scaling) vs target (theta 500000, llama3 x8)",
            file="/models/head/config.json",
        ),
        info("DTYPE_DIFFERS", "drafter dtype float16 vs target bfloat16"),
    ]
    lines = report_markdown(outcome).splitlines()
    heads = [line for line in lines if line.startswith("## ")]
    at = heads.index("## Why acceptance may be low: spectool check's warnings")
    assert heads[at - 1] == "## Acceptance per position"
    body = lines[lines.index(heads[at]) + 1 : lines.index(heads[at + 1])]
    bullets = [line for line in body if line.startswith("- ")]
    assert bullets == [
        "- `ROPE_MISMATCH` (`/models/head/config.json`): head rope (theta 500000, no "
        "rope_scaling) vs target (theta 500000, llama3 x8)"
    ]  # warnings only: the info is not repeated


def test_report_says_when_check_raised_no_warning(tmp_path: Path) -> None:
    text = report_markdown(demo_outcome(tmp_path))
    assert "spectool check raised no warning on this pair." in text
