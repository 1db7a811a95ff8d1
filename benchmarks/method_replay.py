"""Replay ``spectool tune``'s method comparison on recorded method sweeps: no server, seconds.

Each ``benchmarks/tune_vs_method_sweep.py`` run keeps every block in ``OUT/sweep/trials.jsonl``
(labels ``sweep CONFIG c=C round=R block=B``). A round is one recorded *method grid*: every
method at every draft length once per concurrency, with the round's baseline blocks pooled as
every method's ``k = 0`` cell. Taking each round in turn as the measurements, the methods'
searches and the method choice run as ``spectool tune`` runs them
(:func:`spectool.decide.replay_methods.replay_methods`), and the deployment is judged against
the other rounds pooled, over every method and draft length.

``--save FILE`` writes the rounds in the ``spectool.grids/1`` form (one grid per round and
method, source ``ROUND/METHOD``; gzip for ``.gz``), which this script also reads: the test suite
replays ``tests/decide/data/method_grids.json.gz``.

Usage::

    python benchmarks/method_replay.py out/ms-code out/ms-prose [--save FILE]
    python benchmarks/method_replay.py tests/decide/data/method_grids.json.gz
    python benchmarks/method_replay.py --in-place tests/decide/data/method_grids_avx512.json.gz

``--in-place`` searches as ``spectool tune`` does on the embedded engine, which switches the
draft length in place (steps 5b and 5c); without it, as on a server that restarts per draft
length (TensorRT-LLM).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from spectool.decide.replay_methods import (  # noqa: E402
    MethodRound,
    replay_methods,
    rounds_from_grids,
)
from spectool.measure.grids import read_grids, write_grids  # noqa: E402
from spectool.measure.trial import load_trials  # noqa: E402
from spectool.tuning.trials import pooled_cell  # noqa: E402

LABEL = re.compile(r"^sweep (?P<config>.+) c=(?P<c>\d+) round=(?P<round>\d+) block=\d+$")


def rounds_of(folder: Path) -> tuple[list[MethodRound], list[str], list[str], str]:
    """A sweep folder's rounds, their names, the methods in the profile's order, the workload."""
    order = json.loads((folder / "benchmark.json").read_text())["methods"]
    blocks: dict[int, dict[str, dict[int, list]]] = defaultdict(lambda: defaultdict(dict))
    workloads = set()
    for trial in load_trials(folder / "sweep" / "trials.jsonl").values():
        match = LABEL.match(trial.config.label)
        if match is None:
            raise SystemExit(f"{folder}: a trial not of a method sweep: {trial.config.label}")
        by_config = blocks[int(match["round"])][match["config"]]
        by_config.setdefault(int(match["c"]), []).append(trial)
        workloads.add(trial.config.workload_id)
    if len(workloads) != 1:
        raise SystemExit(f"{folder}: trials of more than one workload")
    rounds, sources = [], []
    for r, by_config in sorted(blocks.items()):
        base = {c: pooled_cell(trials, 0) for c, trials in by_config["base"].items()}
        grids: dict[str, dict] = {m: {(c, 0): cell for c, cell in base.items()} for m in order}
        for config, by_c in by_config.items():
            if config == "base":
                continue
            method, k = config.split(" k=")
            for c, trials in by_c.items():
                grids[method][(c, int(k))] = pooled_cell(trials, int(k))
        rounds.append(grids)
        sources.append(f"{folder.name}/round {r}")
    return rounds, sources, order, workloads.pop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", type=Path, help="sweep folders, or one grids file")
    parser.add_argument("--n-boot", type=int, default=300)
    parser.add_argument("--save", type=Path, default=None, help="write the grids file here")
    parser.add_argument("--objective", default="tpot", help="what the searches decide on")
    parser.add_argument(
        "--in-place",
        action="store_true",
        help="search as on the embedded engine, which switches the draft length in place",
    )
    args = parser.parse_args(argv)
    sets = []  # (rounds, sources, order): each workload replayed on its own rounds
    if len(args.sources) == 1 and args.sources[0].is_file():
        sets = rounds_from_grids(*read_grids(args.sources[0]))
    else:
        saved_grids, saved_names, workloads = [], [], []
        for folder in args.sources:
            rounds, names, order, workload_id = rounds_of(folder)
            sets.append((rounds, names, order))
            workloads.append({"name": folder.name, "workload_id": workload_id, "methods": order})
            for round_, name in zip(rounds, names, strict=True):
                for method in order:
                    saved_grids.append(round_[method])
                    saved_names.append(f"{name}/{method}")
        if args.save:
            write_grids(args.save, saved_grids, saved_names, {"workloads": workloads})
            print(f"wrote {args.save}")
    shares = []
    for rounds, names, order in sets:
        for replay in replay_methods(
            rounds,
            names,
            order,
            n_boot=args.n_boot,
            objective=args.objective,
            switches_in_place=args.in_place,
        ):
            shares.append(replay.worst_share)
            cells = ", ".join(
                f"c={row['concurrency']}: {row['chosen']} {row['share_of_best']:.0%} "
                f"(best {row['best']}{'' if row['verdict_agrees'] is not False else ', on/off wrong'})"
                for row in replay.rows
            )
            print(
                f"{replay.source}: {replay.chosen} -> {cells}; {replay.cells_measured} of "
                f"{replay.cells_in_round} speculative cells measured"
            )
    print(
        f"worst share per replay: median {statistics.median(shares):.1%}, min {min(shares):.1%}; "
        f">= 95% everywhere in {sum(s >= 0.95 for s in shares)}/{len(shares)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
