"""The one place that prints: rich tables for people, one JSON object for machines."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from spectool.findings import Finding

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def print_json(obj: Any) -> None:
    """Exactly one JSON object on stdout."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def findings_table(findings: list[Finding], title: str = "Findings") -> Table:
    table = Table(title=title, show_lines=False, expand=False)
    table.add_column("severity")
    table.add_column("code", no_wrap=True)
    table.add_column("message", overflow="fold")
    table.add_column("fix", overflow="fold")
    for f in findings:
        sev = f.severity.value
        table.add_row(f"[{_STYLE[sev]}]{sev}[/]", f.code, f.message, f.hint)
    return table


def gib(n: int | float) -> str:
    """A byte count for people: GiB from 1 GiB up, else MiB."""
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"
