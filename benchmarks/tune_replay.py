"""Replay ``spectool tune``'s search on recorded brute-force sweeps: no server, a few seconds.

Every sweep folder that ``tune_vs_sweep.py`` writes (``OUT/sweep``, ``OUT/sweep2``) holds each
cell of the grid measured once (``trials.jsonl``). Taking each sweep in turn as the measurements,
tune's search (:func:`spectool.decide.tune.tune`, exactly as ``spectool tune`` calls it) asks for
the cells it wants and gets that sweep's; its choices are then judged against a reference made of
all the *other* sweeps pooled cell by cell (every request and step of every other sweep), with
the proof's checks: at every concurrency the chosen ``k`` reaches at least 95% of the reference's
best per-user tokens/s, and the on/off verdict agrees wherever the reference's best speculative
cell differs from its baseline by more than 5%.

Beside tune, the same judgment of the sweep's *own* best cells (what a brute-force sweep of that
one pass would choose) shows how far a single pass of the grid is from the pooled reference on
the same machine: the noise floor that tune's choices are read against.

On a machine whose speed wanders, one live ``tune_vs_sweep.py`` run is one draw; a replay over
ten recorded sweeps is ten draws of the search, judged against references nine times as large.
All sweeps must come from the same pair, server setup and workload (checked).

Usage::

    python benchmarks/tune_replay.py /tmp/bench-*/sweep /tmp/bench-*/sweep2
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tune_vs_sweep import QUALITY, Key, compare, load_sweep, per_user  # noqa: E402

from spectool.decide.cell import CellMeasurement  # noqa: E402
from spectool.decide.tune import tune  # noqa: E402
from spectool.measure.runner import TrialResult  # noqa: E402
from spectool.tuning.trials import pooled_cell  # noqa: E402


def grid_of(sweeps: Sequence[dict[Key, TrialResult]]) -> tuple[tuple[int, ...], int]:
    """Concurrencies and largest k of the full grid every sweep measured."""
    keys = set(sweeps[0])
    if any(set(s) != keys for s in sweeps[1:]):
        raise SystemExit("the sweeps did not measure the same cells")
    concs = tuple(sorted({c for c, _ in keys}))
    n = max(k for _, k in keys)
    if keys != {(c, k) for c in concs for k in range(n + 1)}:
        raise SystemExit("a sweep is not a full grid (interrupted?)")
    return concs, n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", nargs="+", type=Path, help="sweep folders (with trials.jsonl)")
    parser.add_argument("--n-boot", type=int, default=300)
    args = parser.parse_args(argv)
    if len(args.sweeps) < 2:
        parser.error("need at least two sweeps: one to search, the others as the reference")

    loaded = [load_sweep(folder) for folder in args.sweeps]
    if len({identity for _, identity in loaded}) != 1:
        raise SystemExit("the sweeps differ in pair, server setup or workload")
    sweeps = [trials for trials, _ in loaded]
    method = loaded[0][1][0]
    concs, n = grid_of(sweeps)
    cells: list[dict[Key, CellMeasurement]] = [
        {key: pooled_cell([trial], key[1]) for key, trial in s.items()} for s in sweeps
    ]
    print(
        f"{len(sweeps)} sweeps of {len(cells[0])} cells (k = 0..{n}, concurrencies "
        f"{list(concs)}); each replay judged against the other {len(sweeps) - 1} pooled"
    )
    tune_worst: list[float] = []
    own_worst: list[float] = []
    verdicts_ok = 0
    cells_used: list[int] = []
    servers: list[int] = []
    time_shares: list[float] = []
    for i, mine in enumerate(cells):
        others = [s for j, s in enumerate(sweeps) if j != i]
        reference = {key: pooled_cell([s[key] for s in others], key[1]) for key in sweeps[i]}
        _, tps_ref = per_user(reference, args.n_boot, 0)
        result = tune(
            concs, n, lambda c, k, mine=mine: mine[(c, k)], method=method, n_boot=args.n_boot
        )
        rows, _, verdict_ok = compare(result.choices, tps_ref, concs, n)
        _, tps_mine = per_user(mine, args.n_boot, 0)
        own = {c: max(range(n + 1), key=lambda k, c=c: tps_mine[(c, k)]) for c in concs}
        own_rows, _, _ = compare(own, tps_ref, concs, n)
        shares = {row["concurrency"]: row["share_of_best"] for row in rows}
        tune_worst.append(min(shares.values()))
        own_worst.append(min(row["share_of_best"] for row in own_rows))
        verdicts_ok += verdict_ok
        used = result.measured_now
        cells_used.append(len(used))
        servers.append(len({k for _, k in used}))
        total = sum(cell.duration_s or 0.0 for cell in mine.values())
        time_shares.append(sum(mine[key].duration_s or 0.0 for key in used) / total)
        share_txt = " ".join(f"c={c}:{shares[c]:.0%}" for c in concs)
        print(
            f"  {args.sweeps[i]}: tune {result.choices} -> {share_txt}; worst {min(shares.values()):.1%}"
            f" (the sweep's own best: {own_worst[-1]:.1%}); {len(used)} cells, "
            f"{servers[-1]} draft lengths"
        )
    passed = sum(w >= QUALITY for w in tune_worst)
    own_passed = sum(w >= QUALITY for w in own_worst)
    print(
        f"tune: worst share per replay median {statistics.median(tune_worst):.1%}, min "
        f"{min(tune_worst):.1%}; >= {QUALITY:.0%} everywhere in {passed}/{len(cells)}; on/off "
        f"agrees in {verdicts_ok}/{len(cells)}; {statistics.mean(cells_used):.1f} of "
        f"{len(cells[0])} cells, {statistics.mean(servers):.1f} draft lengths, "
        f"{statistics.mean(time_shares):.1%} of a sweep's measuring time"
    )
    print(
        f"a single sweep's own best: worst share median {statistics.median(own_worst):.1%}, min "
        f"{min(own_worst):.1%}; >= {QUALITY:.0%} everywhere in {own_passed}/{len(cells)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
