"""Does ``spectool tune`` give the same decision twice? Repeated runs, a CPU hog, brute force.

On the embedded engine and the embedded demo pair (``spectool tune`` with no model arguments;
extra tune options after ``--``):

1. **Quiet runs**: ``--runs`` back-to-back runs of ``spectool tune`` (each its own process, its
   own folder, as a user runs it). Checks: the same schedule every time, and the per-user
   speed-up at each concurrency (``1 / ratio`` of the chosen cell, 1.0 where speculation is
   off) within +-10% of the median of the runs.
2. **Hog runs**: the same runs with one busy process (a pure-Python loop, one core at full
   speed) started ``--hog-after`` seconds into each run and stopped when it ends. Check: no
   verdict flips against the quiet runs (a cell may be ``inconclusive`` instead; its note says
   why).
3. **Brute force**: ``--sweeps`` independent paired sweeps of every ``k = 0..N`` at every
   concurrency (``--sweep-pairs`` interleaved pairs per cell, no stopping, no model), pooled.
   Check: each run's choice reaches at least 95% of the best per-user tokens/s the pooled
   sweeps find at each concurrency (per-user tokens/s of ``k`` over the baseline's = the
   inverse of its paired ratio).
4. **Cost**: each run's wall time (the main job's target is about 2 minutes on 2 cores).

Prints the tables and the checks; writes ``OUT/repeatability.json``. Exit 0 when every check
holds, 1 otherwise.

Usage::

    python benchmarks/tune_repeatability.py --out out/repeat            # 5 + 5 runs, 3 sweeps
    python benchmarks/tune_repeatability.py --runs 2 --sweeps 0 -- --concurrency 1,4
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

SPREAD = 0.10  # per-user speed-up within +-10% of the median
QUALITY = 0.95  # a run's choice against the sweeps' best
HOG = "import time\nend = time.time() + 3600\nwhile time.time() < end:\n    pass\n"


def run_tune(out: Path, extra: list[str], hog_after: float | None) -> dict:
    """One ``spectool tune`` process; the hog (if any) starts ``hog_after`` s into it."""
    cmd = [sys.executable, "-m", "spectool.cli.app", "tune", "--out", str(out), "--force", *extra]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    hog = None
    try:
        if hog_after is not None:
            try:
                proc.wait(timeout=hog_after)
            except subprocess.TimeoutExpired:
                hog = subprocess.Popen([sys.executable, "-c", HOG])
        log, _ = proc.communicate()
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    wall = time.perf_counter() - started
    (out / "console.log").write_text(log)
    if proc.returncode != 0:
        raise SystemExit(f"tune failed ({proc.returncode}) in {out}:\n{log[-2000:]}")
    decision = json.loads((out / "decision.json").read_text())
    cells = {(c["concurrency"], c["k"]): c for c in decision["cells"]}
    schedule = {int(c): k for c, k in decision["schedule"].items()}
    speedup = {c: (1.0 / cells[(c, k)]["ratio"] if k else 1.0) for c, k in schedule.items()}
    verdicts = {f"{c},{k}": cell["verdict"] for (c, k), cell in cells.items()}
    return {
        "out": str(out),
        "wall_s": wall,
        "schedule": schedule,
        "speedup": speedup,
        "verdicts": verdicts,
        "pairs": {f"{c},{k}": cell.get("pairs") for (c, k), cell in cells.items()},
        "hog": hog is not None,
    }


def paired_sweep(out: Path, extra: list[str], pairs: int, seed: int) -> dict[tuple[int, int], list]:
    """Every speculative cell as ``pairs`` interleaved pairs; returns the pairs per cell."""
    from spectool.decide.paired import BlockPair
    from spectool.measure.runner import measure
    from spectool.tuning.plan import METRICS_INTERVAL_S, make_driver, measurement_plan
    from spectool.tuning.request import TuneRequest, resolve
    from spectool.tuning.trials import pooled_cell

    request = TuneRequest(out=out, force=True, seed=seed, **_tune_fields(extra))
    resolved = resolve(request)
    out.mkdir(parents=True, exist_ok=True)
    count_tokens, prompts, _, plan = measurement_plan(resolved)
    found: dict[tuple[int, int], list] = {}
    with make_driver(resolved, out) as driver:
        for c in resolved.concurrencies:
            for k in range(1, resolved.max_draft_len + 1):
                got = []
                for i in range(pairs):
                    arms = (k, 0) if i % 2 == 0 else (0, k)
                    blocks = {}
                    for arm in arms:
                        info = driver.serve(arm)
                        (trial,) = measure(
                            info.base_url,
                            info.model_name,
                            prompts.prompts,
                            [plan.block_config(c, k, i, arm)],
                            results_path=out / "trials.jsonl",
                            count_tokens=count_tokens,
                            metrics_interval_s=METRICS_INTERVAL_S,
                            metrics_path=info.metrics_path,
                        )
                        blocks[arm] = pooled_cell([trial], arm)
                    got.append(BlockPair(blocks[k], blocks[0], i % 2 == 0))
                found[(c, k)] = got
                print(f"  sweep {out.name}: c={c} k={k}", flush=True)
    return found


def _tune_fields(extra: list[str]) -> dict:
    """The few tune options this script passes on to its sweeps (``--concurrency``,
    ``--max-draft-len``)."""
    fields: dict = {}
    for flag, name, cast in (
        ("--concurrency", "concurrencies", lambda v: tuple(int(x) for x in v.split(","))),
        ("--max-draft-len", "max_draft_len", int),
    ):
        if flag in extra:
            fields[name] = cast(extra[extra.index(flag) + 1])
    return fields


def best_from_sweeps(sweeps: list[dict]) -> dict[int, dict[int, float]]:
    """Per concurrency, per k: per-user tokens/s relative to the baseline, pairs pooled."""
    from spectool.decide.paired import PairedCell, paired_estimate

    keys = sorted(set().union(*sweeps)) if sweeps else []
    speed: dict[int, dict[int, float]] = {}
    for c, k in keys:
        pairs = [p for s in sweeps for p in s.get((c, k), [])]
        speed.setdefault(c, {0: 1.0})[k] = 1.0 / paired_estimate(PairedCell(tuple(pairs))).ratio
    return speed


def _pair_ratios(sweep: dict[tuple[int, int], list]) -> dict[str, list[float]]:
    from spectool.decide.paired import PairedCell, paired_estimate

    return {
        f"{c},{k}": [math.exp(d) for d in paired_estimate(PairedCell(tuple(pairs))).log_ratios]
        for (c, k), pairs in sorted(sweep.items())
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/repeatability"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hog-after", type=float, default=20.0)
    parser.add_argument("--no-hog", action="store_true")
    parser.add_argument("--sweeps", type=int, default=3)
    parser.add_argument("--sweep-pairs", type=int, default=4)
    parser.add_argument("extra", nargs="*", help="options for spectool tune (after --)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    quiet = []
    for i in range(args.runs):
        quiet.append(run_tune(args.out / f"quiet-{i}", args.extra, None))
        print(f"quiet run {i}: {quiet[-1]['wall_s']:.0f} s, schedule {quiet[-1]['schedule']}")
    hogged = []
    if not args.no_hog:
        for i in range(args.runs):
            hogged.append(run_tune(args.out / f"hog-{i}", args.extra, args.hog_after))
            print(f"hog run {i}: {hogged[-1]['wall_s']:.0f} s, schedule {hogged[-1]['schedule']}")
    sweeps = [
        paired_sweep(args.out / f"sweep-{i}", args.extra, args.sweep_pairs, seed=i)
        for i in range(args.sweeps)
    ]

    checks: dict[str, bool] = {}
    concs = sorted(quiet[0]["schedule"])
    print("\nper-user speed-up of the chosen cell (1.00: speculation off)")
    print("run      " + "".join(f"c={c:<8}" for c in concs) + "wall s")
    for name, runs in (("quiet", quiet), ("hog", hogged)):
        for i, run in enumerate(runs):
            cells = "".join(f"{run['speedup'][c]:.2f}k{run['schedule'][c]:<4}" for c in concs)
            print(f"{name}-{i:<4}{cells}{run['wall_s']:.0f}")
    schedules = {json.dumps(r["schedule"], sort_keys=True) for r in quiet}
    checks["same schedule in every quiet run"] = len(schedules) == 1
    worst = 0.0
    for c in concs:
        values = [r["speedup"][c] for r in quiet]
        median = statistics.median(values)
        worst = max(worst, *(abs(v / median - 1.0) for v in values))
    print(f"largest deviation from the median speed-up: {worst:.1%}")
    checks["speed-up within +-10% of the median"] = worst <= SPREAD
    flips = []
    opposite = {"pays": "does_not_pay", "does_not_pay": "pays"}
    for run in hogged:
        for key, verdict in run["verdicts"].items():
            quiet_verdicts = {q["verdicts"].get(key) for q in quiet} - {None, "inconclusive"}
            if verdict in opposite and opposite[verdict] in quiet_verdicts:
                flips.append((run["out"], key, verdict))
    print(f"verdict flips under the hog: {len(flips)} {flips}")
    if hogged:
        checks["no verdict flips under the hog"] = not flips
    quality = {}
    if sweeps:
        best = best_from_sweeps(sweeps)
        print("\npooled sweeps: per-user tokens/s over the baseline, per k")
        for c in concs:
            row = " ".join(f"k={k}:{v:.2f}" for k, v in sorted(best[c].items()))
            print(f"  c={c}: {row}")
        for run in quiet + hogged:
            shares = [best[c][run["schedule"][c]] / max(best[c].values()) for c in concs]
            quality[run["out"]] = min(shares)
        print(
            "worst share of the sweeps' best per run:",
            {Path(k).name: round(v, 3) for k, v in quality.items()},
        )
        checks["every run within 5% of the sweeps' best"] = all(
            v >= QUALITY for v in quality.values()
        )
    walls = [r["wall_s"] for r in quiet]
    print(
        f"\nquiet wall time: median {statistics.median(walls):.0f} s (min {min(walls):.0f}, max {max(walls):.0f})"
    )
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}: {name}")
    (args.out / "repeatability.json").write_text(
        json.dumps(
            {
                "quiet": quiet,
                "hog": hogged,
                "quality": quality,
                "checks": checks,
                "sweeps": [_pair_ratios(s) for s in sweeps],
            },
            indent=1,
            default=str,
        )
    )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
