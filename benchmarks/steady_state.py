"""Where a tune cell's gain comes from: users' time per output token at full load, and the rest.

A paired block of tune (and of the method sweep) is a closed loop of two waves of requests: the
users join one at a time and, as their requests end at different lengths, leave one at a time.
For part of a block fewer than ``concurrency`` requests are in flight. This reads a finished
tune folder and splits each block's pooled time per output token (decode time over decode
tokens, what tune's default objective compares) into the decode intervals during which every
one of the ``concurrency`` users had a request in flight (*full load*) and the rest, then
prints per concurrency the paired ratios (speculative over baseline block of the same pair)
both ways: their geometric mean, the standard deviation of their logs, and the share of decode
tokens decoded at full load.

    python benchmarks/steady_state.py DIR [--method draft_model]

``DIR`` is a ``spectool tune`` output folder (``DIR/<method>/trials.jsonl`` for a method
comparison, or ``DIR/trials.jsonl``).
"""

from __future__ import annotations

import argparse
import bisect
import math
import re
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SPEC = re.compile(r" k=(\d+) #p(\d+) ")
BASE = re.compile(r" #p(\d+)/k(\d+) ")


def split_tpot(records: Sequence[Any], concurrency: int) -> tuple[float, float, float]:
    """(pooled TPOT of the block, pooled TPOT of its full-load decode intervals, the share of
    decode tokens decoded at full load). An interval between two chunks of a request counts as
    full load when at least ``concurrency`` requests are in flight all through it. TPOTs are
    ``nan`` where there are no such tokens."""
    ok = [r for r in records if r.error is None]
    edges = sorted([(r.send_time_s, 1) for r in ok] + [(r.end_time_s, -1) for r in ok])
    times, level, count = [], [], 0
    for at, step in edges:
        count += step
        times.append(at)
        level.append(count)

    def lowest(a: float, b: float) -> int:
        """The fewest requests in flight over [a, b]."""
        i = bisect.bisect_right(times, a) - 1
        j = bisect.bisect_left(times, b)  # events strictly before b
        first = level[i] if i >= 0 else 0
        return min([first, *level[i + 1 : j]])

    total_s = total_n = full_s = full_n = 0.0
    for r in ok:
        chunks = list(zip(r.chunk_times_s, r.chunk_token_counts, strict=True))
        for (a, _), (b, n) in zip(chunks, chunks[1:], strict=False):
            if n <= 0:
                continue
            total_s += b - a
            total_n += n
            if lowest(a, b) >= concurrency:
                full_s += b - a
                full_n += n
    nan = float("nan")
    return (
        total_s / total_n if total_n else nan,
        full_s / full_n if full_n else nan,
        full_n / total_n if total_n else nan,
    )


def paired_blocks(trials: dict[str, Any]) -> dict[tuple[int, int], list[tuple[Any, Any]]]:
    """(concurrency, k) -> [(speculative trial, baseline trial)] of each measured pair."""
    spec: dict[tuple[int, int, int], Any] = {}
    base: dict[tuple[int, int, int], Any] = {}
    for trial in trials.values():
        label, c = f" {trial.config.label} ", trial.config.concurrency
        if found := BASE.search(label):
            base[c, int(found[2]), int(found[1])] = trial
        elif found := SPEC.search(label):
            spec[c, int(found[1]), int(found[2])] = trial
    out: dict[tuple[int, int], list[tuple[Any, Any]]] = {}
    for key, trial in sorted(spec.items()):
        if key in base:
            out.setdefault(key[:2], []).append((trial, base[key]))
    return out


def summary(pairs: list[tuple[Any, Any]], concurrency: int) -> dict[str, float]:
    """Geometric-mean paired ratio and the log ratios' standard deviation, whole blocks and
    full load, and the mean share of decode tokens at full load."""
    whole, full, shares = [], [], []
    for spec, base in pairs:
        s, b = split_tpot(spec.records, concurrency), split_tpot(base.records, concurrency)
        whole.append(math.log(s[0] / b[0]))
        if not (math.isnan(s[1]) or math.isnan(b[1])):
            full.append(math.log(s[1] / b[1]))
        shares.append((s[2] + b[2]) / 2)

    def sd(values: list[float]) -> float:
        return statistics.stdev(values) if len(values) > 1 else float("nan")

    return {
        "pairs": len(pairs),
        "whole": math.exp(statistics.mean(whole)),
        "whole_sd": sd(whole),
        "full": math.exp(statistics.mean(full)) if full else float("nan"),
        "full_sd": sd(full),
        "full_pairs": len(full),
        "share": statistics.mean(shares),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--method", default="draft_model")
    args = parser.parse_args()

    from spectool.measure.trial import load_trials

    path = args.dir / args.method / "trials.jsonl"
    if not path.exists():
        path = args.dir / "trials.jsonl"
    pairs = paired_blocks(load_trials(path))
    print(f"{path}: speculative / baseline time per output token, per pair")
    print(
        f"{'c':>3} {'k':>2} {'pairs':>5}  {'whole blocks':>20}  {'full load':>20}  full-load tokens"
    )
    for (c, k), found in sorted(pairs.items()):
        s = summary(found, c)
        print(
            f"{c:>3} {k:>2} {s['pairs']:>5}  {s['whole']:8.3f} (sd {s['whole_sd']:.3f})  "
            f"{s['full']:8.3f} (sd {s['full_sd']:.3f})  {s['share']:.0%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
