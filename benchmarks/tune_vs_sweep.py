"""Proof for ``spectool tune``: its choices against an independent brute-force sweep.

On the embedded engine (CPU unless ``--device`` says otherwise), for the embedded demo pair by
default:

1. **Sweep**: every draft length ``k = 0..N`` at every concurrency, each cell measured exactly
   as tune measures one (same prompts, same trial configs: :class:`spectool.tuning.trials.
   CellPlan`), one server per ``k`` (k-major order, the cheapest order for a sweep). Its wall
   time counts server starts and measuring.
2. **Tune**: ``spectool tune`` with the same settings in a fresh folder
   (:func:`spectool.tuning.session.run_tune`); its wall time is the whole run (check, prompts,
   servers, measuring, decision, every output file).
3. **Checks**, with the sweep's measurements as the reference:

   * quality: at every concurrency, the per-user tokens/s of tune's chosen ``k`` (as the sweep
     measured it) is at least 95% of the best per-user tokens/s the sweep measured there;
   * verdicts: wherever the sweep's best speculative cell differs from its baseline by more
     than 5% in per-user tokens/s, tune's on/off choice agrees with the sweep's;
   * cost: tune's wall time is at most 40% of the sweep's.

4. **Noise floor** (``--noise-floor``): a second, independent sweep after tune; its own best
   choices are held to the first sweep with checks 1 and 2. On a machine whose speed wanders
   (shared cores) even a brute-force sweep does not agree with itself; this says how much.
   Tune's choices are also judged against both sweeps pooled cell by cell (half the variance);
   ``--reference-sweeps`` pools recorded sweeps of earlier runs (same pair, setup and workload)
   into one more reference; ``benchmarks/tune_replay.py`` replays the search on many of them.

Prints the table and the three checks, writes everything to ``OUT/benchmark.json``; exit code 0
when all three hold, 1 otherwise.

Usage::

    python benchmarks/tune_vs_sweep.py                          # demo pair, N=4, c=1,2,4,8
    python benchmarks/tune_vs_sweep.py --max-draft-len 8 --concurrency 1,2,4,8,16
    python benchmarks/tune_vs_sweep.py TARGET DRAFTER --out out/bench --noise-floor
    python benchmarks/tune_vs_sweep.py --max-draft-len 8 --concurrency 1,2,4,8,16 --noise-floor \
        --reference-sweeps out/earlier-run/sweep out/earlier-run/sweep2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from spectool.decide.cost import evaluate_cell  # noqa: E402
from spectool.decide.replay import QUALITY, VERDICT_MARGIN, compare  # noqa: E402
from spectool.decide.stats import cell_stats  # noqa: E402
from spectool.measure.runner import TrialResult, load_trials, measure  # noqa: E402
from spectool.tuning.plan import METRICS_INTERVAL_S, make_driver, measurement_plan  # noqa: E402
from spectool.tuning.request import TuneRequest, parse_concurrencies, resolve  # noqa: E402
from spectool.tuning.session import run_tune  # noqa: E402
from spectool.tuning.trials import pooled_cell  # noqa: E402

TIME_SHARE = 0.40


def sweep(resolved, out: Path) -> tuple[dict, float, str]:  # noqa: ANN001
    """Measure every cell, k-major; returns (cells, wall seconds, workload id)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "trials.jsonl").unlink(missing_ok=True)
    count_tokens, prompts, _, plan = measurement_plan(resolved)
    cells = {}
    started = time.perf_counter()
    with make_driver(resolved, out) as driver:
        for k in range(resolved.max_draft_len + 1):
            for c in resolved.concurrencies:
                info = driver.serve(k)
                results = measure(
                    info.base_url,
                    info.model_name,
                    prompts.prompts,
                    plan.configs(c, k),
                    results_path=out / "trials.jsonl",
                    count_tokens=count_tokens,
                    metrics_interval_s=METRICS_INTERVAL_S,
                )
                bad = [r for t in results for r in t.errors]
                if bad:
                    raise SystemExit(
                        f"sweep cell c={c} k={k}: {len(bad)} requests failed: {bad[0].error}"
                    )
                cells[(c, k)] = pooled_cell(results, k)
                print(f"  sweep c={c} k={k}: {time.perf_counter() - started:.0f} s", flush=True)
    return cells, time.perf_counter() - started, prompts.workload_id


LABEL = re.compile(
    r"^(?P<engine>\S+) (?P<method>\S+) k=(?P<k>\d+) #(?P<repeat>\S+) setup=(?P<setup>\S+)$"
)
Key = tuple[int, int]


def load_sweep(folder: Path) -> tuple[dict[Key, TrialResult], tuple[str, str, str]]:
    """A sweep's trials by (concurrency, k), and its (method, setup, workload) identity."""
    trials: dict[Key, TrialResult] = {}
    identity: set[tuple[str, str, str]] = set()
    for result in load_trials(folder / "trials.jsonl").values():
        match = LABEL.match(result.config.label)
        if match is None or match["repeat"] == "drift":
            continue
        k = int(match["k"])
        if k > 0:
            identity.add((match["method"], match["setup"], result.config.workload_id))
        else:
            identity.add(("", match["setup"], result.config.workload_id))
        trials[(result.config.concurrency, k)] = result
    setups = {(s, w) for _, s, w in identity}
    methods = {m for m, _, _ in identity if m}
    if len(setups) != 1 or len(methods) > 1:
        raise SystemExit(f"{folder}: trials of more than one setup or workload")
    (setup, workload), method = setups.pop(), (methods.pop() if methods else "")
    return trials, (method, setup, workload)


def sweep_choices(tps: dict[tuple[int, int], float], concs: tuple[int, ...], n: int) -> dict:
    """A sweep's own pick: the k with the best per-user tokens/s at each concurrency."""
    return {c: max(range(n + 1), key=lambda k: tps[(c, k)]) for c in concs}


def per_user(cells: dict, n_boot: int, seed: int) -> tuple[dict, dict]:  # noqa: ANN001
    """(per-cell stats, per-user tokens/s) of a sweep."""
    stats = {key: cell_stats(cell, n_boot=n_boot, seed=seed) for key, cell in cells.items()}
    return stats, {key: s.tokens_per_s_per_user.value for key, s in stats.items()}


def print_rows(title: str, rows: list[dict], n: int) -> None:
    print(title)
    header = ["c", *(f"k={k} tok/s" for k in range(n + 1)), "best", "chosen", "chosen/best"]
    print(" | ".join([*header, "best spec vs off", "on/off agrees"]))
    for row in rows:
        agree = {True: "yes", False: "NO", None: "(<5%)"}[row["verdict_agrees"]]
        tps = row["sweep_tokens_per_s_per_user"]
        print(
            " | ".join(
                [
                    str(row["concurrency"]),
                    *(f"{tps[str(k)]:.1f}" for k in range(n + 1)),
                    str(row["sweep_best_k"]),
                    str(row["chosen_k"]),
                    f"{row['share_of_best']:.1%}",
                    f"{row['sweep_best_spec_vs_off']:+.1%}",
                    agree,
                ]
            )
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", nargs="?", default=None)
    parser.add_argument("drafter", nargs="?", default=None)
    parser.add_argument("--max-draft-len", type=int, default=None)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--noise-floor", action="store_true", help="a second sweep after tune")
    parser.add_argument(
        "--reference-sweeps",
        nargs="+",
        type=Path,
        default=[],
        metavar="DIR",
        help="recorded sweep folders (OUT/sweep, OUT/sweep2 of earlier runs with the same pair, "
        "setup and workload), pooled with this run's sweeps into one more reference",
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "out" / "bench-tune-vs-sweep")
    args = parser.parse_args(argv)

    resolved = resolve(
        TuneRequest(
            target=args.target,
            drafter=args.drafter,
            engine="torch",
            max_draft_len=args.max_draft_len,
            concurrencies=parse_concurrencies(args.concurrency),
            num_prompts=args.num_prompts,
            max_tokens=args.max_tokens,
            device=args.device,
            threads=args.threads,
            out=args.out / "tune",
            force=True,
        )
    )
    req = resolved.request
    concs = resolved.concurrencies
    n = resolved.max_draft_len
    drafter = resolved.report.drafter.ref if resolved.report.drafter else "-"
    print(
        f"pair {resolved.report.target.ref} + {drafter} ({resolved.method}), k = 0..{n}, "
        f"concurrencies {list(concs)}, {resolved.num_prompts} prompts x {resolved.max_tokens} "
        f"tokens, server threads {resolved.threads}",
        flush=True,
    )
    print("sweep:", flush=True)
    sweep_cells, sweep_s, sweep_workload = sweep(resolved, args.out / "sweep")
    print(f"sweep: {len(sweep_cells)} cells in {sweep_s:.1f} s", flush=True)

    print("tune:", flush=True)
    outcome = run_tune(resolved)
    tune_s = outcome.wall_s
    result = outcome.result
    assert outcome.prompts.workload_id == sweep_workload, "tune and sweep used different prompts"
    print(
        f"tune: {result.runs_used} of {result.full_grid_runs} cells in {tune_s:.1f} s "
        f"(measuring {outcome.measure_s:.1f} s)",
        flush=True,
    )
    stats, tps = per_user(sweep_cells, req.n_boot, req.seed)
    ratios = {
        (c, k): evaluate_cell(sweep_cells[(c, k)], sweep_cells[(c, 0)], n_boot=req.n_boot)
        for c in concs
        for k in range(1, n + 1)
    }
    rows, quality_ok, verdict_ok = compare(result.choices, tps, concs, n)
    time_share = tune_s / sweep_s
    time_ok = time_share <= TIME_SHARE

    floor = None
    if args.noise_floor:
        print("second sweep (noise floor):", flush=True)
        again, again_s, _ = sweep(resolved, args.out / "sweep2")
        _, tps2 = per_user(again, req.n_boot, req.seed)
        floor_rows, floor_quality, floor_verdicts = compare(
            sweep_choices(tps2, concs, n), tps, concs, n
        )
        # Both sweeps pooled per cell: a reference with half the variance of either one.
        both_trials = [load_sweep(args.out / name)[0] for name in ("sweep", "sweep2")]
        both = {key: pooled_cell([t[key] for t in both_trials], key[1]) for key in sweep_cells}
        _, tps_both = per_user(both, req.n_boot, req.seed)
        pooled_rows, pooled_quality, pooled_verdicts = compare(result.choices, tps_both, concs, n)
        floor = {
            "wall_s": again_s,
            "rows": floor_rows,
            "quality": floor_quality,
            "verdicts": floor_verdicts,
            "pooled_rows": pooled_rows,
            "pooled_quality": pooled_quality,
            "pooled_verdicts": pooled_verdicts,
        }

    print()
    print_rows(
        "tune's choices against the sweep (per-user tokens/s as the sweep measured):", rows, n
    )
    print()
    print("sweep ratio lhs/rhs (95% CI) per cell:")
    for c in concs:
        cells_txt = ", ".join(
            f"k={k} {ratios[(c, k)].ratio:.2f} ({ratios[(c, k)].ci_low:.2f}-"
            f"{ratios[(c, k)].ci_high:.2f})"
            for k in range(1, n + 1)
        )
        print(f"  c={c}: {cells_txt}")
    print(f"tune schedule {result.choices}, break-even {result.break_even_concurrency}")
    if outcome.drift is not None:
        print(f"tune's drift check: {outcome.drift.describe()}")
    if floor is not None:
        print()
        print_rows(
            "noise floor: a second sweep's own best choices against the first:", floor["rows"], n
        )
        print(
            f"noise floor: quality {'PASS' if floor['quality'] else 'FAIL'} (worst "
            f"{min(r['share_of_best'] for r in floor['rows']):.1%}), verdicts "
            f"{'PASS' if floor['verdicts'] else 'FAIL'}"
        )
        print()
        print_rows(
            "tune's choices against both sweeps pooled (each cell's requests of both sweeps):",
            floor["pooled_rows"],
            n,
        )
        print(
            f"against both sweeps pooled: quality "
            f"{'PASS' if floor['pooled_quality'] else 'FAIL'} (worst "
            f"{min(r['share_of_best'] for r in floor['pooled_rows']):.1%}), verdicts "
            f"{'PASS' if floor['pooled_verdicts'] else 'FAIL'}"
        )
    pooled_ref = None
    if args.reference_sweeps:
        own_dirs = [args.out / "sweep"] + ([args.out / "sweep2"] if args.noise_floor else [])
        loaded = [load_sweep(folder) for folder in [*own_dirs, *args.reference_sweeps]]
        if len({identity for _, identity in loaded}) != 1:
            raise SystemExit("--reference-sweeps: not the same pair, server setup and workload")
        if any(set(trials) != set(sweep_cells) for trials, _ in loaded):
            raise SystemExit("--reference-sweeps: a folder does not hold the whole grid")
        pooled = {
            key: pooled_cell([trials[key] for trials, _ in loaded], key[1]) for key in sweep_cells
        }
        _, tps_pooled = per_user(pooled, req.n_boot, req.seed)
        ref_rows, ref_quality, ref_verdicts = compare(result.choices, tps_pooled, concs, n)
        pooled_ref = {
            "sweeps": [str(folder) for folder in [*own_dirs, *args.reference_sweeps]],
            "rows": ref_rows,
            "quality": ref_quality,
            "verdicts": ref_verdicts,
        }
        print()
        print_rows(
            f"tune's choices against {len(loaded)} sweeps pooled (this run's and "
            f"{len(args.reference_sweeps)} recorded):",
            ref_rows,
            n,
        )
        print(
            f"against {len(loaded)} sweeps pooled: quality {'PASS' if ref_quality else 'FAIL'} "
            f"(worst {min(r['share_of_best'] for r in ref_rows):.1%}), verdicts "
            f"{'PASS' if ref_verdicts else 'FAIL'}"
        )
    print()
    print(
        f"check 1 (quality >= {QUALITY:.0%} of the best per-user tokens/s everywhere): "
        f"{'PASS' if quality_ok else 'FAIL'} (worst {min(r['share_of_best'] for r in rows):.1%})"
    )
    print(
        f"check 2 (on/off agrees where the sweep differs by > {VERDICT_MARGIN:.0%}): "
        f"{'PASS' if verdict_ok else 'FAIL'}"
    )
    print(
        f"check 3 (tune wall time <= {TIME_SHARE:.0%} of the sweep's): "
        f"{'PASS' if time_ok else 'FAIL'} ({tune_s:.1f} s / {sweep_s:.1f} s = {time_share:.1%}; "
        f"{result.runs_used} of {result.full_grid_runs} cells)"
    )
    report = {
        "pair": [resolved.report.target.ref, drafter],
        "max_draft_len": n,
        "concurrencies": list(concs),
        "num_prompts": resolved.num_prompts,
        "max_tokens": resolved.max_tokens,
        "threads": resolved.threads,
        "sweep_wall_s": sweep_s,
        "tune_wall_s": tune_s,
        "tune_measure_s": outcome.measure_s,
        "tune_runs_used": result.runs_used,
        "full_grid": result.full_grid_runs,
        "tune_choices": {str(c): k for c, k in result.choices.items()},
        "tune_drift": outcome.drift.to_json() if outcome.drift is not None else None,
        "rows": rows,
        "sweep_stats": {f"{c},{k}": s.to_json() for (c, k), s in stats.items()},
        "sweep_verdicts": {f"{c},{k}": dataclasses.asdict(v) for (c, k), v in ratios.items()},
        "noise_floor": floor,
        "pooled_reference": pooled_ref,
        "checks": {
            "quality": quality_ok,
            "verdicts": verdict_ok,
            "time": time_ok,
            "time_share": time_share,
        },
    }
    (args.out / "benchmark.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out / 'benchmark.json'}")
    return 0 if quality_ok and verdict_ok and time_ok else 1


if __name__ == "__main__":
    sys.exit(main())
