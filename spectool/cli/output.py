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


# Below this many columns, tables of long text switch to a vertical layout: side by side, the
# columns get so narrow that rich breaks words and codes in the middle.
WIDE_COLUMNS = 120


def is_narrow(width: int | None = None) -> bool:
    return (console.width if width is None else width) < WIDE_COLUMNS


def findings_table(
    findings: list[Finding], title: str = "Findings", width: int | None = None
) -> Table:
    """Severity, code, message and fix side by side; in a narrow terminal one finding per
    block (``severity CODE`` on one line, then the message and the fix at full width)."""
    if is_narrow(width):
        table = Table(title=title, show_header=False, show_lines=True, expand=True)
        table.add_column("finding", ratio=1)
        for f in findings:
            sev = f.severity.value
            hint = f"\n[dim]fix:[/] {f.hint}" if f.hint else ""
            table.add_row(f"[{_STYLE[sev]}]{sev}[/] [bold]{f.code}[/]\n{f.message}{hint}")
        return table
    table = Table(title=title, show_lines=False, expand=False)
    table.add_column("severity", no_wrap=True)
    table.add_column("code", no_wrap=True)
    table.add_column("message", ratio=3)
    table.add_column("fix", ratio=2)
    for f in findings:
        sev = f.severity.value
        table.add_row(f"[{_STYLE[sev]}]{sev}[/]", f.code, f.message, f.hint)
    return table


def gib(n: int | float) -> str:
    """A byte count for people: GiB from 1 GiB up, else MiB."""
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


def layout_words(lay: dict) -> str:
    """``TP 8 x PP 2, EP 1 on 2 x 8 GPUs; TP over NVLink, stages over inter-node``."""
    words = (
        f"TP {lay['tp']} x PP {lay['pp']}, EP {lay['ep']}"
        f"{', attention DP' if lay['attention_dp'] else ''} on {lay['nodes']} x "
        f"{lay['gpus_per_node']} GPUs; TP over {lay['tp_link']}"
    )
    if lay["pp_link"]:
        words += f", stage sends over {'/'.join(sorted(set(lay['pp_link'])))}"
    return words
