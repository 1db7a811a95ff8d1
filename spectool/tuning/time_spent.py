"""Where a comparison's measuring time went: seconds of blocks per concurrency and per arm.

Why: a run of the main job spends minutes measuring, and its report said only how long each
method's (dry) search took to read its cells back, a few seconds each in the joint design. What
a user needs to see is what the minutes bought: per concurrency, the seconds of baseline blocks
(the right side of every ratio) and of each method's speculative blocks, and how many requests
a block sends (above concurrency 1 the whole workload, so every cell's estimate is the
workload's; :func:`~spectool.tuning.trials.block_requests`).

Read from every method's ``trials.jsonl`` (each line a finished block, :mod:`spectool.measure.
trial`). In the joint design one baseline block is saved under the label of every arm of its
round (:mod:`spectool.tuning.joint`): a block is counted once, by its concurrency, start and
wall time. Only the fields this needs are read; a line that lacks them, or a file that is not
there, adds nothing (the searches that wrote the files have read them whole already).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from spectool.tuning.report import DASH
from spectool.tuning.setup import TRIALS_NAME

BASELINE = "baseline"


@dataclass(frozen=True)
class TimeSpent:
    """Seconds and blocks per ``(concurrency, arm)``; ``arm`` is a method or :data:`BASELINE`.
    ``requests[c]``: the requests most blocks at ``c`` sent."""

    seconds: dict[tuple[int, str], float]
    blocks: dict[tuple[int, str], int]
    requests: dict[int, int]

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    def concurrencies(self) -> list[int]:
        return sorted({c for c, _ in self.seconds})

    def at(self, c: int) -> float:
        """Seconds of every block at concurrency ``c``."""
        return sum(s for (cc, _), s in self.seconds.items() if cc == c)

    def of(self, arm: str) -> float:
        """Seconds of ``arm``'s blocks at every concurrency."""
        return sum(s for (_, a), s in self.seconds.items() if a == arm)

    def to_json(self) -> dict[str, object]:
        return {
            "total_s": self.total_s,
            "by_concurrency": {
                str(c): {
                    "requests_per_block": self.requests[c],
                    "seconds": {a: s for (cc, a), s in sorted(self.seconds.items()) if cc == c},
                    "blocks": {a: n for (cc, a), n in sorted(self.blocks.items()) if cc == c},
                }
                for c in self.concurrencies()
            },
        }


def _arm(label: str) -> str | None:
    """The method of a trial label (``"torch draft_model k=4 #p3/k4 setup=..."``, the method
    ``none`` for the baseline; :meth:`~spectool.tuning.trials.CellPlan.label`)."""
    parts = label.split()
    if len(parts) < 3 or not parts[2].startswith("k="):
        return None
    return BASELINE if parts[1] == "none" else parts[1]


def time_spent(folders: Mapping[str, Path]) -> TimeSpent:
    """The blocks of every method's ``trials.jsonl`` in ``folders`` (method -> its folder),
    each block counted once."""
    seen: set[tuple[int, str, float]] = set()
    seconds: Counter[tuple[int, str]] = Counter()
    blocks: Counter[tuple[int, str]] = Counter()
    sizes: dict[int, Counter[int]] = {}
    for folder in folders.values():
        path = Path(folder) / TRIALS_NAME
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            try:
                obj = json.loads(line)
                config = obj["config"]
                c, label = int(config["concurrency"]), str(config["label"])
                wall, started = float(obj["wall_time_s"]), str(obj["started_at"])
                n = len(obj["records"])
            except (ValueError, KeyError, TypeError):
                continue
            arm = _arm(label)
            if arm is None or (c, started, wall) in seen:
                continue
            seen.add((c, started, wall))
            seconds[(c, arm)] += wall
            blocks[(c, arm)] += 1
            sizes.setdefault(c, Counter())[n] += 1
    requests = {c: max(counts, key=lambda n: (counts[n], n)) for c, counts in sizes.items()}
    return TimeSpent(dict(seconds), dict(blocks), requests)


def time_markdown(spent: TimeSpent, methods: list[str]) -> list[str]:
    """The report's section: a table of seconds (blocks) per concurrency and arm, and totals."""
    if not spent.seconds:
        return []
    arms = [BASELINE, *methods]
    total = spent.total_s
    lines = [
        "",
        "## Time",
        "",
        f"{total:.0f} s of measured blocks. Per concurrency, the seconds of each arm's blocks "
        "(blocks in brackets): the baseline's are the right side of every ratio; a block "
        "above concurrency 1 sends the whole workload in whole waves (every cell's estimate "
        "is the workload's), and a budget ends a cell no sooner than the pairs a verdict "
        "rests on, so the dearest cells are the large concurrencies' and the close ones'.",
        "",
        "| concurrency | requests a block | " + " | ".join(arms) + " | total | share |",
        "|---:|---:|" + "---:|" * len(arms) + "---:|---:|",
    ]
    for c in spent.concurrencies():
        row = [
            f"{spent.seconds[(c, a)]:.0f} ({spent.blocks[(c, a)]})"
            if (c, a) in spent.seconds
            else DASH
            for a in arms
        ]
        lines.append(
            f"| {c} | {spent.requests[c]} | "
            + " | ".join(row)
            + f" | {spent.at(c):.0f} | {spent.at(c) / total:.0%} |"
        )
    lines.append(
        "| all | | " + " | ".join(f"{spent.of(a):.0f}" for a in arms) + f" | {total:.0f} | 100% |"
    )
    return lines
