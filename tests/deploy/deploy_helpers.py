"""Helpers shared by the build/serve tests: decision files, process inspection."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE3 = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
EAGLE1 = "yuhuili/EAGLE-LLaMA3-Instruct-8B"


def decision_json(
    schedule: dict[int, int], *, method: str = "eagle3", engine: str = "tensorrt-llm"
) -> dict[str, Any]:
    """A decision.json as spectool tune writes it: choices plus one measured cell each."""
    cells = []
    for c, k in sorted(schedule.items()):
        ratio = 0.6 if k else 1.15
        cells.append(
            {
                "concurrency": c,
                "k": k or 1,
                "lhs_ms_per_token": round(10 * ratio, 3),
                "rhs_ms_per_token": 10.0,
                "ratio": ratio,
                "ci_low": ratio - 0.04,
                "ci_high": ratio + 0.04,
                "verdict": "pays" if k else "does_not_pay",
            }
        )
    on = [c for c, k in schedule.items() if k]
    return {
        "engine": engine,
        "method": method,
        "max_draft_len": schedule[min(schedule)],
        "searched_max_draft_len": 4,
        "schedule": {str(c): k for c, k in sorted(schedule.items())},
        "break_even_concurrency": min(
            (c for c in schedule if c > max(on, default=0)), default=None
        ),
        "cells": cells,
        "runs": {"used": 9, "full_grid": 20},
    }


def write_decision(path: Path, schedule: dict[int, int], **kwargs: Any) -> Path:
    path.write_text(json.dumps(decision_json(schedule, **kwargs)), encoding="utf-8")
    return path


def processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) for every process, from /proc (Linux)."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), int(fields[2]))
    return table


def children_of(pid: int) -> list[int]:
    return [p for p, (ppid, _) in processes().items() if ppid == pid]


def group_members(pgid: int) -> list[int]:
    return [p for p, (_, group) in processes().items() if group == pgid]
