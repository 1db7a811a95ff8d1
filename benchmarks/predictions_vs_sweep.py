"""tune's predictions, out of sample, against a brute-force sweep of every method and draft length.

Each tune run records, per method, the ratio its step-cost model predicted for every
(concurrency, k) from the plan's cells alone (``DIR/<method>/tune.json``, ``predictions``). A
method sweep (``benchmarks/tune_vs_method_sweep.py``, ``OUT/benchmark.json``) measured every
method at every ``k``, each block against the baseline blocks that bracket it; its per-user
speed-up per round, pooled over rounds (and over several sweeps of the same workload: pass
them all), is the truth: ratio ``= 1 / speed-up``. Per concurrency and in all, this prints
``log(truth / predicted)`` over every (run, method, k): mean (the bias: above 0 the predictions
were optimistic), root mean square, and the 10th and 90th percentiles. The 10th percentile is
the side pruning rests on: predictions too pessimistic by ``1 - exp(p10)`` in one case of ten
(``spectool.decide.prune``'s measured error is the same statistic on the recorded grids). The
tune runs' predictions are those of the code they ran on: to judge a change to the predictor,
run tune with it on the same workload and compare with the runs before.

``--ranking`` prints the same statistic for draft lengths judged against a measured neighbour
(:func:`spectool.decide.prune.ranking_residuals`: ``log(truth(k) / truth(k_m)) -
log(predicted(k) / predicted(k_m))`` for every ``k`` a run did not measure, ``k_m`` the nearest
it did), at batch 1 and batched: what tune's step 5b compares with. ``--write-ranking FILE``
also writes its inputs (the sweep's truth, each run's predictions and measured draft lengths)
as the fixture the shipped :data:`~spectool.decide.prune.RANKING_HIGH` is recomputed from
(``tests/decide/data/k_ranking.json.gz``); ``--label`` names the workload in it (repeat the
command per workload with the same ``FILE``: the records are added).

Usage::

    python benchmarks/predictions_vs_sweep.py --sweep out/msweep --sweep out/msweep-c4 \\
        out/msweep/tune-0 out/msweep/tune-1 tune-demo
    python benchmarks/predictions_vs_sweep.py --ranking --sweep out/ms-code --label code \\
        --write-ranking tests/decide/data/k_ranking.json.gz out/ms-code/tune-9 out/ms-code/tune-10
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from spectool.decide.prune import ranking_residuals
from spectool.decide.sweep_judge import bracketed_speedups
from spectool.io import atomic_write_bytes

Key = tuple[str, int, int]  # method, concurrency, k


def sweep_truth(benchmarks: Iterable[Mapping[str, object]]) -> dict[Key, float]:
    """Per (method, concurrency, k): the per-token ratio the sweeps measured, the geometric mean
    over every round of every sweep of one over the bracketed speed-up."""
    logs: dict[Key, list[float]] = {}
    for bench in benchmarks:
        rounds = bench["rounds"]
        assert isinstance(rounds, dict)
        for c, per_round in rounds.items():
            for blocks in per_round:
                for name, speedup in bracketed_speedups([tuple(b) for b in blocks]).items():
                    if name == "base":
                        continue
                    method, k = name.split(" k=")
                    logs.setdefault((method, int(c), int(k)), []).append(-math.log(speedup))
    return {key: math.exp(statistics.fmean(v)) for key, v in logs.items()}


def run_predictions(run: Path) -> dict[Key, float]:
    """A tune run's predicted ratios per (method, concurrency, k > 0), from every method's
    ``tune.json`` (a single-method run: its own; :func:`run_records`)."""
    return {
        (str(r["method"]), int(r["concurrency"]), int(k)): ratio  # type: ignore[call-overload]
        for r in run_records(run)
        for k, ratio in r["predicted"].items()  # type: ignore[attr-defined]
    }


def run_records(run: Path) -> list[dict[str, object]]:
    """Per method and concurrency of a tune run: its predicted ratios ``{k: ratio}`` and the
    draft lengths it measured (the inputs of :func:`spectool.decide.prune.ranking_residuals`)."""
    files = sorted(run.glob("*/tune.json")) or [run / "tune.json"]
    out: list[dict[str, object]] = []
    for path in files:
        data = json.loads(path.read_text())
        method = data.get("setup", {}).get("method") or path.parent.name
        measured: dict[int, list[int]] = {}
        for cell in data.get("cells", []):
            if cell["k"] > 0 and cell.get("verdict"):
                measured.setdefault(cell["concurrency"], []).append(cell["k"])
        predicted: dict[int, dict[str, float]] = {}
        for p in data.get("predictions") or []:
            if p["k"] > 0:
                predicted.setdefault(p["concurrency"], {})[str(p["k"])] = p["ratio"]
        for c, ratios in sorted(predicted.items()):
            out.append(
                {
                    "run": run.name,
                    "method": method,
                    "concurrency": c,
                    "predicted": ratios,
                    "measured": sorted(measured.get(c, [])),
                }
            )
    return out


def write_ranking(
    path: Path, label: str, truth: Mapping[Key, float], records: Sequence[Mapping[str, object]]
) -> None:
    """Add one workload's truth and records to the ranking fixture at ``path`` (gzip JSON)."""
    data: dict[str, object] = {"format": "spectool-k-ranking/1", "workloads": []}
    if path.exists():
        data = json.loads(gzip.decompress(path.read_bytes()))
    workloads = [w for w in data["workloads"] if w["label"] != label]  # type: ignore[attr-defined,index]
    workloads.append(
        {
            "label": label,
            "truth": [[m, c, k, r] for (m, c, k), r in sorted(truth.items())],
            "runs": list(records),
        }
    )
    data["workloads"] = workloads
    atomic_write_bytes(path, gzip.compress(json.dumps(data, indent=1).encode(), mtime=0))


def residuals(
    truth: Mapping[Key, float], runs: Sequence[Mapping[Key, float]]
) -> dict[str, list[float]]:
    """``log(truth / predicted)`` per concurrency (``"all"``: every one), over the runs' cells
    that the sweep measured."""
    out: dict[str, list[float]] = {"all": []}
    for predicted in runs:
        for key, ratio in predicted.items():
            if key in truth and ratio > 0:
                r = math.log(truth[key] / ratio)
                out.setdefault(str(key[1]), []).append(r)
                out["all"].append(r)
    return out


def summary(values: Sequence[float]) -> dict[str, float]:
    """Mean, root mean square, 10th and 90th percentiles (nearest rank) and count."""
    ranked = sorted(values)
    n = len(ranked)

    def pct(q: float) -> float:
        return ranked[min(n - 1, max(0, math.ceil(q * n) - 1))]

    return {
        "n": n,
        "mean": statistics.fmean(ranked),
        "rms": math.sqrt(statistics.fmean(v * v for v in ranked)),
        "p10": pct(0.10),
        "p90": pct(0.90),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", type=Path, action="append", required=True)
    parser.add_argument("runs", type=Path, nargs="+", help="tune output folders")
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    parser.add_argument("--ranking", action="store_true", help="against a measured neighbour")
    parser.add_argument("--write-ranking", type=Path, default=None, help="the ranking fixture")
    parser.add_argument("--label", default="workload", help="the workload's name in it")
    args = parser.parse_args(argv)
    benches = []
    for folder in args.sweep:
        path = folder / "benchmark.json" if folder.is_dir() else folder
        try:
            benches.append(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            print(f"error: {path}: {e}", file=sys.stderr)
            return 2
    truth = sweep_truth(benches)
    if args.ranking or args.write_ranking is not None:
        records = [r for run in args.runs for r in run_records(run)]
        print("ranking: log(truth(k)/truth(k_m)) - log(predicted(k)/predicted(k_m)), k_m measured")
        for kind, values in ranking_residuals(truth, records).items():
            if values:
                s = summary(values)
                print(
                    f"{kind:>8}: n={s['n']:>3}  mean {s['mean']:+.3f}  p10 {s['p10']:+.3f} "
                    f"(high {math.exp(-s['p10']):.3f})  p90 {s['p90']:+.3f}"
                )
        if args.write_ranking is not None:
            write_ranking(args.write_ranking, args.label, truth, records)
        return 0
    runs = [run_predictions(run) for run in args.runs]
    if not any(runs):
        print("error: no predictions in the tune folders given", file=sys.stderr)
        return 2
    table = {c: summary(v) for c, v in residuals(truth, runs).items() if v}
    print("log(truth / predicted), out of sample against the sweep (above 0: optimistic)")
    for c in sorted(table, key=lambda c: (c == "all", int(c) if c.isdigit() else 0)):
        s = table[c]
        print(
            f"concurrency {c:>3}: n={s['n']:>3}  mean {s['mean']:+.3f}  rms {s['rms']:.3f}  "
            f"p10 {s['p10']:+.3f} ({max(0.0, 1 - math.exp(s['p10'])):.0%} too pessimistic)  "
            f"p90 {s['p90']:+.3f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
