"""tune's verdict against what users measure on the deployment it wrote (issue 22's Done-when).

Reads a finished tune folder DIR (a build: ``decision.json`` + the engine configs; tune's
built-in workload, rebuilt here and checked against ``tune.json``'s workload id, so both
measure the same prompts and output lengths), starts two
servers from it with ``spectool serve``: the deployment as built (``--speculation on``: the
chosen schedule, applied batch by batch) and its baseline (``--speculation off``), both on
127.0.0.1. Then, for each traffic shape, runs short blocks in rounds of A B / B A (``--rounds``,
each block two waves of the concurrency or ``--requests``, so that both arms of a round see the
same state of a shared machine) with spectool's
streaming client (:func:`spectool.measure.runner.measure`, whose TPOT agrees with AIPerf's,
``benchmarks/aiperf_vs_spectool.py``), both arms the same prompts in the same order, after one
unrecorded trial per arm and shape (a server's first batches of a new size pay one-off costs):

* ``cN``: closed loop at concurrency N, every request ``--max-tokens`` tokens (tune's old shape);
* ``cNvar``: closed loop at N, output lengths varied per request (tune's built-in workload);
* ``rR``: open loop, Poisson arrivals at R req/s, lengths varied, the same send times per arm.

Per shape it prints the spec / base ratios (median over rounds, range): TPOT (decode time per
token after the first, summed over requests: the definition tune's ``tpot`` objective uses),
TPOT p99, E2E mean and p99, TTFT mean, and output throughput (base / spec, so below 1 pays
everywhere), and for the closed-loop shapes tune's own ratio for the objective at that
concurrency, from ``decision.json``'s chosen cell. Exit 0 when, at every ``cNvar`` shape (tune's
own: its prompts with their varied lengths) tune measured, tune's ratio is within 10% of the
users' median TPOT ratio (as speed-ups: ``|users / tune - 1| <= 0.10``) and at no closed-loop
shape tune chose speculation where the users' TPOT ratio is above 1 in every round; 1
otherwise.

    python benchmarks/tune_vs_users.py DIR [--shapes c1,c16,c1var,c16var,c4var,r6] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from aiperf_vs_spectool import free_port, wait_healthy  # noqa: E402

AGREE = 0.10


def start(build: Path, speculation: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spectool.cli.app",
            "serve",
            str(build),
            "--speculation",
            speculation,
            "--port",
            str(port),
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    return proc, f"http://127.0.0.1:{port}"


def shape_config(shape: str, requests: int, max_tokens: int, seed: int):  # noqa: ANN201
    from spectool.measure.trial import TrialConfig

    varied = shape.endswith("var") or shape.startswith("r")
    if shape.startswith("r"):
        rate = float(shape[1:])
        config = TrialConfig(
            shape, rate_per_s=rate, num_prompts=requests, max_tokens=max_tokens, seed=seed
        )
    else:
        c = int(shape[1:].removesuffix("var"))
        config = TrialConfig(
            shape,
            concurrency=c,
            num_prompts=max(requests, 2 * c),
            max_tokens=max_tokens,
            warmup_requests=c,
        )
    return config, varied


def ratios(spec, base) -> dict[str, float]:  # noqa: ANN001
    """spec / base of the users' metrics (throughput: base / spec, so below 1 pays)."""
    import numpy as np

    def tpot(trial) -> float:  # noqa: ANN001
        used = [r for r in trial.records if r.ok and r.output_tokens >= 2 and r.decode_s]
        return sum(r.decode_s for r in used) / sum(r.output_tokens - 1 for r in used)

    def pct(trial, key: str, q: float) -> float:  # noqa: ANN001
        vals = []
        for r in trial.records:
            if not r.ok:
                continue
            if key == "tpot" and r.output_tokens >= 2 and r.tpot_s is not None:
                vals.append(r.tpot_s)
            elif key == "e2e":
                vals.append(r.e2e_s)
            elif key == "ttft" and r.ttft_s is not None:
                vals.append(r.ttft_s)
        return float(np.percentile(vals, q)) if q < 100 else float(np.mean(vals))

    def throughput(trial) -> float:  # noqa: ANN001
        return sum(r.output_tokens for r in trial.records if r.ok) / trial.wall_time_s

    return {
        "tpot": tpot(spec) / tpot(base),
        "tpot_p99": pct(spec, "tpot", 99) / pct(base, "tpot", 99),
        "e2e": pct(spec, "e2e", 100) / pct(base, "e2e", 100),
        "e2e_p99": pct(spec, "e2e", 99) / pct(base, "e2e", 99),
        "ttft": pct(spec, "ttft", 100) / pct(base, "ttft", 100),
        "throughput": throughput(base) / throughput(spec),
    }


def tune_ratio(decision: dict, concurrency: int) -> tuple[int, float | None]:
    """tune's chosen k at ``concurrency`` and its cell's objective ratio (None: not measured)."""
    schedule = {int(c): k for c, k in decision["schedule"].items()}
    if concurrency not in schedule:
        return 0, None
    k = schedule[concurrency]
    if k == 0:
        return 0, None
    cell = next(
        (c for c in decision["cells"] if c["concurrency"] == concurrency and c["k"] == k), None
    )
    return k, None if cell is None else cell["ratio"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", type=Path, help="a finished tune folder (its build)")
    parser.add_argument("--shapes", default="c1,c16,c1var,c16var,c4var,r6")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=8, help="per block, at least 2 x c")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("out/tune_vs_users"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from spectool.measure.client import tokenizer_counter
    from spectool.measure.runner import measure
    from spectool.tuning.prompts import tune_prompts

    decision = json.loads((args.build / "decision.json").read_text())
    tuned = next(
        path
        for path in (args.build / "tune.json", args.build / decision["method"] / "tune.json")
        if path.is_file()
    )
    workload = json.loads(tuned.read_text())["workload"]
    if workload["source"] != "builtin":
        raise SystemExit(
            f"{tuned}: tune ran on {workload['source']}; this benchmark rebuilds "
            "only the built-in workload"
        )
    target = REPO_ROOT / "spectool" / "assets" / "models" / "demo-target"
    built = tune_prompts(  # tune's own prompts and output lengths (checked by the workload id)
        None,
        workload["prompts"],
        count_tokens=tokenizer_counter(target),
        max_prompt_tokens=workload["max_prompt_tokens"],
        seed=0,
        mean_output=args.max_tokens,
    )
    if built.workload_id != workload["id"]:
        raise SystemExit(f"rebuilt workload {built.workload_id} is not tune's {workload['id']}")
    varied = list(built.prompts)
    fixed = [replace(p, max_tokens=None) for p in varied]
    spec_proc, spec_url = start(args.build, "on", args.out / "spec.log")
    base_proc, base_url = start(args.build, "off", args.out / "base.log")
    results: dict[str, list[dict[str, float]]] = {}
    try:
        wait_healthy(spec_url)
        wait_healthy(base_url)
        import httpx

        model: str = httpx.get(spec_url + "/v1/models").json()["data"][0]["id"]
        for shape in args.shapes.split(","):
            # one unrecorded trial per arm first: a server's first batches at a new size pay
            # one-off costs (allocations, kernel selection) that belong to neither arm
            config, vary = shape_config(shape, args.requests, args.max_tokens, seed=99)
            for url in (spec_url, base_url):
                measure(url, model, varied if vary else fixed, [config], poll_metrics=False)
            for r in range(args.rounds):
                config, vary = shape_config(shape, args.requests, args.max_tokens, seed=r)
                # the rounds walk through the prompts; both arms of a round send the same ones
                config = replace(config, prompt_offset=(r * config.num_prompts) % len(fixed))
                prompts = varied if vary else fixed
                got = {}
                order = ("spec", "base") if r % 2 == 0 else ("base", "spec")
                for arm in order:
                    url = spec_url if arm == "spec" else base_url
                    got[arm] = measure(url, model, prompts, [config], poll_metrics=False)[0]
                row = ratios(got["spec"], got["base"])
                results.setdefault(shape, []).append(row)
                print(f"{shape} round {r}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))
                time.sleep(0.2)
    finally:
        for proc in (spec_proc, base_proc):
            proc.terminate()
            proc.wait(timeout=60)

    keys = ("tpot", "tpot_p99", "e2e", "e2e_p99", "ttft", "throughput")
    print(
        "\n| traffic | " + " | ".join(keys) + " | tune (k, objective ratio) | users/tune |\n"
        "|---|" + "---:|" * len(keys) + "---|---:|"
    )
    ok = True
    for shape, rows in results.items():
        cells = []
        for key in keys:
            vals = [row[key] for row in rows]
            cells.append(f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})")
        verdict, agree = "-", "-"
        if shape.startswith("c"):
            c = int(shape[1:].removesuffix("var"))
            k, ratio = tune_ratio(decision, c)
            users = statistics.median(row["tpot"] for row in rows)
            if ratio is not None:
                verdict = f"k={k}, {ratio:.3f}"
                speedups = (1 / users) / (1 / ratio)
                agree = f"{speedups:.2f}"
                if shape.endswith("var"):  # tune's own shape (its prompts' varied lengths)
                    ok &= abs(speedups - 1) <= AGREE
            elif k == 0:
                verdict = "off"
            if k > 0 and all(row["tpot"] > 1 for row in rows):
                ok = False  # speculation deployed where users are slower in every round
        print(f"| {shape} | " + " | ".join(cells) + f" | {verdict} | {agree} |")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
