"""What tune's blocks measure against what users under sustained load get (issue 21).

tune (and the method sweep that judges it) measures a concurrency in short closed-loop blocks:
two waves of the concurrency's requests, the users joining one at a time, then draining. Users
whose traffic keeps ``C`` requests in flight for minutes see the loop full all the time. This
benchmark measures both on one server that switches between the baseline and one
configuration (``--method``, ``--k``) in place, in rounds that alternate which arm runs first:

* **sustained**: one closed loop of ``--long`` requests per arm; the ratio over its requests
  after the first two waves (the loop full and turned over), and per wave, so the transient
  after a block starts shows;
* **tune blocks**: ``--pairs`` pairs of tune's own blocks (two waves, users joining one at a
  time, the drain included: :meth:`spectool.tuning.trials.CellPlan.block_config`);
* **full-load blocks**: ``--pairs`` pairs of blocks whose two measured waves start once the
  loop is full and has turned over once, extra requests keeping it full until they end
  (``TrialConfig.full_load``, :func:`spectool.measure.runner._full_load_loop`).

Per kind: the geometric mean of speculative over baseline time per output token (pooled over
a block's requests: decode time over decode tokens, tune's default objective) with a +-2
standard-error interval, the spread of the pairs' logs, and the seconds a block takes.

    python benchmarks/sustained_load.py --concurrency 16 --rounds 4 --out out/sustained16
    python benchmarks/sustained_load.py --concurrency 4 --long 96 --rounds 6 --out out/sustained4

Writes every block to ``OUT/trials.jsonl`` and the summary to ``OUT/sustained.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

WAVES = 2  # tune's blocks: spectool.tuning.trials.BLOCK_WAVES


def pooled_tpot(records: Sequence[Any]) -> float:
    """Decode seconds over decode tokens of the requests that finished without error."""
    seconds = tokens = 0.0
    for r in records:
        if r.error is None and r.first_token_time_s is not None and r.output_tokens > 1:
            seconds += r.end_time_s - r.first_token_time_s
            tokens += r.output_tokens - 1
    if tokens == 0:
        raise ValueError("no decode tokens in the block")
    return seconds / tokens


def by_wave(records: Sequence[Any], concurrency: int) -> list[float]:
    """Pooled TPOT of each wave: the requests in send order, ``concurrency`` at a time."""
    ordered = sorted(records, key=lambda r: r.send_time_s)
    return [pooled_tpot(ordered[i : i + concurrency]) for i in range(0, len(ordered), concurrency)]


def summarize(ratios: Sequence[float], seconds: Sequence[float]) -> dict[str, float]:
    """Geometric mean ratio, its +-2 standard-error interval, the logs' spread, block time."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    sd = statistics.stdev(logs) if len(logs) > 1 else float("nan")
    se = sd / math.sqrt(len(logs))
    return {
        "n": len(logs),
        "ratio": math.exp(mean),
        "low": math.exp(mean - 2 * se),
        "high": math.exp(mean + 2 * se),
        "sd": sd,
        "block_s": statistics.fmean(seconds) if seconds else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--method", default="draft_model")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--long", type=int, default=160, help="requests of a sustained block")
    parser.add_argument("--pairs", type=int, default=2, help="short pairs of each kind a round")
    parser.add_argument("--workload", default=None)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    c = args.concurrency
    if c < 2 or args.long < 4 * c or args.rounds < 2:
        parser.error("need --concurrency >= 2, --long >= 4 x concurrency and --rounds >= 2")

    from spectool.measure.runner import TrialConfig, measure
    from spectool.tuning.compare import method_requests, resolve_all
    from spectool.tuning.plan import METRICS_INTERVAL_S, make_driver, measurement_plan
    from spectool.tuning.request import TuneRequest

    args.out.mkdir(parents=True, exist_ok=True)
    request = TuneRequest(
        out=args.out / "setup",
        engine="torch",
        concurrencies=(c,),
        workload=Path(args.workload) if args.workload else None,
        num_prompts=None,
        max_tokens=args.max_tokens,
        max_draft_len=max(args.k, 1),
        seed=args.seed,
        force=True,
    )
    resolved = resolve_all(method_requests(request))
    count_tokens, prompts, _, _ = measurement_plan(resolved[0])
    chosen = [r for r in resolved if r.method == args.method]
    if not chosen:
        parser.error(f"--method {args.method}: the profile has {[r.method for r in resolved]}")
    others = [r for r in resolved if r.method != args.method]
    driver = make_driver(chosen[0], args.out / "server", alternatives=others)
    n = len(prompts.prompts)
    rng = random.Random(args.seed)

    def block(label: str, k: int, indices: Sequence[int], full_load: bool) -> tuple[Any, float]:
        info = driver.serve(k, args.method if k else None)
        config = TrialConfig(
            label=label,
            concurrency=c,
            num_prompts=len(indices),
            max_tokens=args.max_tokens,
            prompt_indices=tuple(indices),
            full_load=full_load,
        )
        started = time.perf_counter()
        result = measure(
            info.base_url,
            info.model_name,
            prompts.prompts,
            [config],
            count_tokens=count_tokens,
            metrics_interval_s=METRICS_INTERVAL_S,
            metrics_path=info.metrics_path,
            results_path=args.out / "trials.jsonl",
            finished={},
        )[0]
        return result, time.perf_counter() - started

    ratios: dict[str, list[float]] = {"sustained": [], "tune blocks": [], "full-load blocks": []}
    seconds: dict[str, list[float]] = {name: [] for name in ratios}
    waves: list[list[float]] = []
    try:
        for rnd in range(args.rounds):
            arms = (0, args.k) if rnd % 2 == 0 else (args.k, 0)
            order = [rng.randrange(n) for _ in range(args.long)]
            got, per_wave = {}, {}
            for k in arms:
                result, took = block(f"sustained k={k} round={rnd}", k, order, False)
                ordered = sorted(result.records, key=lambda r: r.send_time_s)
                got[k] = pooled_tpot(ordered[WAVES * c :])
                per_wave[k] = by_wave(result.records, c)
                seconds["sustained"].append(took)
            ratios["sustained"].append(got[args.k] / got[0])
            waves.append([s / b for s, b in zip(per_wave[args.k], per_wave[0], strict=False)])
            for pair in range(args.pairs):
                indices = [rng.randrange(n) for _ in range(WAVES * c)]
                for name, full in (("tune blocks", False), ("full-load blocks", True)):
                    tpot = {}
                    for k in arms if pair % 2 == 0 else arms[::-1]:
                        label = f"{name} k={k} round={rnd} pair={pair}"
                        result, took = block(label, k, indices, full)
                        tpot[k] = pooled_tpot(result.records)
                        seconds[name].append(took)
                    ratios[name].append(tpot[args.k] / tpot[0])
            print(
                f"round {rnd + 1}/{args.rounds}: "
                + ", ".join(f"{name} {values[-1]:.3f}" for name, values in ratios.items()),
                flush=True,
            )
    finally:
        driver.close()

    summary = {name: summarize(ratios[name], seconds[name]) for name in ratios}
    wave_ratios = [
        math.exp(statistics.fmean(math.log(w[i]) for w in waves))
        for i in range(min(len(w) for w in waves))
    ]
    print(
        f"\n{args.method} k={args.k} / baseline, time per output token, concurrency {c} "
        f"({args.rounds} rounds; +-2 standard errors):"
    )
    for name, s in summary.items():
        print(
            f"  {name:17s} {s['ratio']:.3f} ({s['low']:.3f}-{s['high']:.3f})  "
            f"pairs {s['n']:2d}, sd of logs {s['sd']:.3f}, {s['block_s']:.1f} s a block"
        )
    print("  sustained, per wave: " + " ".join(f"{r:.2f}" for r in wave_ratios))
    out = {"args": {**vars(args), "out": str(args.out)}, "summary": summary}
    out["per_wave"] = wave_ratios
    out["ratios"] = ratios
    (args.out / "sustained.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
