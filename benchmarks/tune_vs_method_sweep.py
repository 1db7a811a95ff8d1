"""Proof for tune's method choice: its deployed (method, k) against an interleaved brute-force
sweep of every method and every draft length, on the embedded engine.

1. **Sweep**: one server per method (the demo profile's draft model, EAGLE-3 head and n-gram
   lookup, each holding its drafter at ``--max-draft-len`` and switching ``k`` in place), all
   up at once. Each round visits every concurrency; there every configuration (the baseline,
   and every method at every ``k``) runs one whole pass over tune's prompts, in a fresh random
   order per round (interleaved, so the machine's drift spreads over all configurations).
   Per configuration: per-user decode tokens/s, the mean over requests of
   ``(output tokens - 1) / (end - first token)``, pooled over the rounds.
2. **Tune**: ``spectool tune`` (the method comparison) ``--runs`` times, each in a fresh
   folder, with the same workload, concurrencies and settings.
3. **Checks** per run and concurrency: the per-user tokens/s of tune's deployed (method, k)
   (the sweep's measurement of it; off = the baseline) is at least 95% of the sweep's best;
   where the sweep's best differs from its baseline by more than 5%, tune's on/off agrees.

Prints the table and the checks and writes ``OUT/benchmark.json``; exit 0 when every check
holds, 1 otherwise.

Usage::

    python benchmarks/tune_vs_method_sweep.py --out out/msweep                   # built-in
    python benchmarks/tune_vs_method_sweep.py --workload code.jsonl --concurrency 1,4,16 \
        --max-tokens 64 --num-prompts 16 --runs 5 --out out/msweep-code
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from spectool.measure.runner import TrialConfig, measure  # noqa: E402
from spectool.tuning.compare import method_requests, resolve_all  # noqa: E402
from spectool.tuning.plan import METRICS_INTERVAL_S, make_driver, measurement_plan  # noqa: E402
from spectool.tuning.request import TuneRequest, parse_concurrencies  # noqa: E402
from spectool.tuning.trials import BLOCK_WAVES  # noqa: E402

QUALITY = 0.95
VERDICT_MARGIN = 0.05


def per_user_tokens_per_s(records) -> list[float]:  # noqa: ANN001
    """Per request: decode tokens over decode time (the first token is the prefill's)."""
    rates = []
    for r in records:
        if r.first_token_time_s is None or r.output_tokens < 2:
            continue
        span = r.end_time_s - r.first_token_time_s
        if span > 0:
            rates.append((r.output_tokens - 1) / span)
    return rates


def sweep(args: argparse.Namespace, out: Path) -> dict[str, dict[str, list[float]]]:
    """``{concurrency: {config: per-request rates}}``, config ``base`` or ``method k=K``."""
    requests = method_requests(_request(args, out / "sweep-setup"))
    resolved = resolve_all(requests)
    count_tokens, prompts, _, _ = measurement_plan(resolved[0])
    rates: dict[str, dict[str, list[float]]] = {}
    drivers = []
    for r in resolved:
        folder = out / "sweep" / r.method
        folder.mkdir(parents=True, exist_ok=True)
        drivers.append((r.method, make_driver(r, folder)))
    rng = random.Random(args.seed)
    n = len(prompts.prompts)
    try:
        for round_ in range(args.rounds):
            for c in parse_concurrencies(args.concurrency):
                configs = [("base", drivers[0][1], 0)] + [
                    (f"{m} k={k}", d, k)
                    for m, d in drivers
                    for k in range(1, args.max_draft_len + 1)
                ]
                rng.shuffle(configs)
                order = list(range(n))
                rng.shuffle(order)
                for name, driver, k in configs:
                    info = driver.serve(k)
                    trial = TrialConfig(
                        label=f"sweep {name} c={c} round={round_}",
                        concurrency=c,
                        # at least two waves, as tune's blocks (trials.BLOCK_WAVES): a closed
                        # loop in which finished requests are replaced and arriving prefills
                        # stall the others' decoding; one wave of c would decode in lockstep
                        num_prompts=max(n, BLOCK_WAVES * c),
                        max_tokens=args.max_tokens,
                        prompt_indices=tuple(order),
                    )
                    result = measure(
                        info.base_url,
                        info.model_name,
                        prompts.prompts,
                        [trial],
                        count_tokens=count_tokens,
                        metrics_interval_s=METRICS_INTERVAL_S,
                        metrics_path=info.metrics_path,
                    )[0]
                    got = per_user_tokens_per_s(result.records)
                    rates.setdefault(str(c), {}).setdefault(name, []).extend(got)
                print(f"sweep round {round_ + 1}/{args.rounds}, concurrency {c} done", flush=True)
    finally:
        for _, driver in drivers:
            driver.close()
    return rates


def _request(args: argparse.Namespace, out: Path) -> TuneRequest:
    return TuneRequest(
        out=out,
        engine="torch",
        concurrencies=parse_concurrencies(args.concurrency),
        workload=Path(args.workload) if args.workload else None,
        num_prompts=args.num_prompts,
        max_tokens=args.max_tokens,
        max_draft_len=args.max_draft_len,
        seed=args.seed,
        force=True,
    )


def run_tune(args: argparse.Namespace, out: Path) -> tuple[dict, float]:
    argv = [
        sys.executable, "-m", "spectool.cli.app", "tune", "--out", str(out), "--force",
        "--max-draft-len", str(args.max_draft_len), "--concurrency", args.concurrency,
        "--max-tokens", str(args.max_tokens),
    ]  # fmt: skip
    if args.num_prompts:
        argv += ["--num-prompts", str(args.num_prompts)]
    if args.workload:
        argv += ["--workload", args.workload]
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    return json.loads((out / "decision.json").read_text()), wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default=None)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--max-draft-len", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("out/method-sweep"))
    parser.add_argument("--sweep-only", action="store_true")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rates = sweep(args, out)
    sweep_s = time.perf_counter() - started
    means = {c: {k: sum(v) / len(v) for k, v in by.items()} for c, by in rates.items()}
    runs = []
    for i in range(0 if args.sweep_only else args.runs):
        decision, wall = run_tune(args, out / f"tune-{i}")
        runs.append({"decision": decision, "wall_s": wall})
    ok = True
    print(f"\nsweep: {sweep_s:.0f} s, per-user decode tokens/s (mean over requests and rounds)")
    for c, by in means.items():
        best_name = max(by, key=by.get)
        best = by[best_name]
        base = by["base"]
        row = f"c={c}: base {base:.0f}, best {best_name} {best:.0f}"
        for i, run in enumerate(runs):
            d = run["decision"]
            k = int(d["schedule"].get(c, 0))
            name = "base" if k == 0 else f"{d['method']} k={k}"
            got = by[name]
            share = got / best
            agree = abs(best / base - 1) <= VERDICT_MARGIN or ((k > 0) == (best_name != "base"))
            ok &= share >= QUALITY and agree
            row += f"; run {i}: {name} {got:.0f} ({share:.0%}{'' if agree else ', on/off wrong'})"
        print(row)
    for i, run in enumerate(runs):
        print(f"tune run {i}: {run['wall_s']:.0f} s, {run['decision']['methods']['why']}")
    (out / "benchmark.json").write_text(
        json.dumps(
            {
                "args": vars(args) | {"out": str(out)},
                "sweep_s": sweep_s,
                "means": means,
                "rates": rates,
                "runs": runs,
                "ok": ok,
            },
            indent=2,
        )  # fmt: skip
    )
    print("all checks hold" if ok else "a check failed")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
