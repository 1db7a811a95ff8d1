"""Replay ``spectool tune``'s search on recorded brute-force sweeps: no server, seconds.

Each sweep folder that ``tune_vs_sweep.py`` writes (``OUT/sweep``, ``OUT/sweep2``) holds every
cell of the grid measured once (``trials.jsonl``). Taking each sweep in turn as the measurements,
tune's search (:func:`spectool.decide.tune.tune`, as ``spectool tune`` calls it) gets the cells
it asks for from that sweep, and its choices are judged against all the *other* sweeps pooled
cell by cell with the proof's checks (:mod:`spectool.decide.replay`). Beside it, the same
judgment of the sweep's own best cells: what one brute-force pass would have chosen.

On a machine whose speed wanders, one live ``tune_vs_sweep.py`` run is one draw; a replay over
sixteen recorded sweeps is sixteen draws, each judged against a reference fifteen times larger.
All sweeps must come from the same pair, server setup and workload (checked).

``--save FILE`` writes the sweeps in the compact ``spectool.grids/1`` form (what the decision
uses, gzip for ``.gz``), which this script also reads: ``tests/decide/data/demo_grids_n8.json.gz``
holds the sixteen sweeps of the demo pair recorded in November 2026.

Usage::

    python benchmarks/tune_replay.py /tmp/bench-*/sweep /tmp/bench-*/sweep2 [--save FILE]
    python benchmarks/tune_replay.py tests/decide/data/demo_grids_n8.json.gz
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tune_vs_sweep import load_sweep  # noqa: E402

from spectool.decide.cell import CellMeasurement  # noqa: E402
from spectool.decide.replay import QUALITY, replay  # noqa: E402
from spectool.measure.grids import read_grids, write_grids  # noqa: E402
from spectool.tuning.trials import pooled_cell  # noqa: E402


def from_folders(
    folders: list[Path],
) -> tuple[list[dict[tuple[int, int], CellMeasurement]], dict[str, str]]:
    loaded = [load_sweep(folder) for folder in folders]
    identities = {identity for _, identity in loaded}
    if len(identities) != 1:
        raise SystemExit("the sweeps differ in pair, server setup or workload")
    method, setup, workload = identities.pop()
    grids = [{key: pooled_cell([t], key[1]) for key, t in trials.items()} for trials, _ in loaded]
    return grids, {"method": method, "setup": setup, "workload_id": workload}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", type=Path, help="sweep folders, or one grids file")
    parser.add_argument("--n-boot", type=int, default=300)
    parser.add_argument("--save", type=Path, default=None, help="write the grids file here")
    args = parser.parse_args(argv)

    if len(args.sources) == 1 and args.sources[0].is_file():
        grids, sources, meta = read_grids(args.sources[0])
    else:
        grids, meta = from_folders(args.sources)
        sources = [str(folder) for folder in args.sources]
    if args.save is not None:
        write_grids(args.save, grids, sources, meta)
        print(f"wrote {len(grids)} grids to {args.save}")
    replays = replay(grids, sources, n_boot=args.n_boot, method=str(meta.get("method", "")))
    cells = len(grids[0])
    print(f"{len(grids)} sweeps of {cells} cells; each replay judged against the others pooled")
    for r in replays:
        shares = " ".join(f"c={row['concurrency']}:{row['share_of_best']:.0%}" for row in r.rows)
        print(
            f"  {r.source}: tune {r.choices} -> {shares}; worst {r.worst_share:.1%} (the sweep's "
            f"own best: {r.own_worst_share:.1%}); {len(r.measured)} cells, {r.draft_lengths} "
            "draft lengths"
        )
    worst = [r.worst_share for r in replays]
    own = [r.own_worst_share for r in replays]
    print(
        f"tune: worst share per replay median {statistics.median(worst):.1%}, min "
        f"{min(worst):.1%}; >= {QUALITY:.0%} everywhere in {sum(r.quality for r in replays)}/"
        f"{len(replays)}; on/off agrees in {sum(r.verdicts for r in replays)}/{len(replays)}; "
        f"{statistics.mean(len(r.measured) for r in replays):.1f} of {cells} cells, "
        f"{statistics.mean(r.draft_lengths for r in replays):.1f} draft lengths, "
        f"{statistics.mean(r.measuring_share for r in replays):.1%} of a sweep's measuring time"
    )
    print(
        f"a single sweep's own best: worst share median {statistics.median(own):.1%}, min "
        f"{min(own):.1%}; >= {QUALITY:.0%} everywhere in "
        f"{sum(w >= QUALITY for w in own)}/{len(replays)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
