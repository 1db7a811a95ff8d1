"""spectool's client against NVIDIA AIPerf on the same server, prompts and arrival rate.

Starts ``spectool serve --engine torch`` (the demo pair, draft_model k=4, 127.0.0.1), writes
tune's built-in prompts as an AIPerf ``single_turn`` file (each with its output length), then
runs, interleaved A B, B A (``--rounds`` times): AIPerf (``aiperf profile``, paced with
``--request-rate`` under a ``--concurrency`` ceiling so the client is not the bottleneck on 2
cores, streaming completions, ``ignore_eos`` and ``min_tokens`` so every request has the same
length) and spectool's own load generator (:func:`spectool.measure.runner.measure`, a
closed-loop trial at the same concurrency). Same prompts in the same order; both count tokens
from the server's usage. At concurrency 1 no request overlaps another, so the two tools see the
same server work request by request; with open-loop arrivals on both sides the overlap of
requests (and so TPOT) would depend on each tool's random arrival draw.

``--open-loop``: spectool's side sends at ``--rate`` too (Poisson, as a tune rate level does)
instead of a closed loop, so both tools pace the same way (their random draws differ); give
AIPerf a ``--concurrency`` ceiling above what the rate keeps in flight, or its ceiling turns
its pacing into a closed loop (at ``--concurrency 1`` no two of its requests overlap).
``--trace FILE``: both tools read the same mooncake/AIPerf trace (AIPerf's ``mooncake_trace``
dataset with ``--fixed-schedule``; spectool's ``--workload`` reader, replayed at the trace's
timestamps as tune's trace level does) against the demo target served without speculation
(each tool synthesises its own text for the trace's lengths, and without speculation the work
per request depends on the lengths alone). ``--poisson-trace``: the benchmark writes that
trace itself, ``OUT/trace.jsonl``: tune's built-in prompts as ``text_input`` rows (the literal
prompt, which AIPerf 0.13's mooncake_trace sends as is and spectool's reader reads) at Poisson
send times of ``--rate`` (seeded), each with ``--max-tokens``; both tools then send the same
texts at the same times to the server with speculation on, so the server does the same work
for both and only the clients differ.

Prints TTFT (mean, p50) and TPOT (AIPerf's ITL = (E2E - TTFT) / (OSL - 1), the same formula as
spectool's TPOT) per tool and round, their ratios, and the acceptance length AIPerf read from
the server's per-request ``metrics.speculative_decoding``. Exit 0 when the tools agree within
10% on TTFT and TPOT (the median over rounds of each round's spectool / AIPerf ratio: the
two tools run back to back in a round, so the machine's drift between rounds cancels) and
AIPerf reports an acceptance length, 1 otherwise.

AIPerf is not a dependency of spectool: install it in a separate environment
(``python -m venv /tmp/aiperf && /tmp/aiperf/bin/pip install 'aiperf==0.13.*'``) and pass
``--aiperf /tmp/aiperf/bin/aiperf``.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

AGREE = 0.10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout_s: float = 300.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not become healthy")


def run_aiperf(
    aiperf: str, url: str, model: str, tokenizer: Path, prompts: Path, args, out: Path
) -> dict:  # noqa: ANN001
    if args.trace is not None:
        dataset = [
            "--input-file", str(args.trace), "--custom-dataset-type", "mooncake_trace",
            "--fixed-schedule",
        ]  # fmt: skip
    else:
        dataset = [
            "--input-file", str(prompts), "--custom-dataset-type", "single_turn",
            "--request-rate", str(args.rate), "--concurrency", str(args.concurrency),
            "--request-count", str(args.requests),
        ]  # fmt: skip
    cmd = [
        aiperf, "profile", "-m", model, "--url", url, "--endpoint-type", "completions",
        "--streaming", *dataset,
        "--tokenizer", str(tokenizer), "--extra-inputs", "ignore_eos:true",
        *([] if args.trace else ["--extra-inputs", f"min_tokens:{args.max_tokens}"]),
        "--extra-inputs", "temperature:0",
        "--output-artifact-dir", str(out), "--use-server-token-count", "--random-seed", "0",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"aiperf failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    data = json.loads((out / "profile_export_aiperf.json").read_text())
    acceptance = data.get("spec_decode_acceptance_length") or {}
    return {
        "ttft_mean_ms": data["time_to_first_token"]["avg"],
        "ttft_p50_ms": data["time_to_first_token"]["p50"],
        "tpot_mean_ms": data["inter_token_latency"]["avg"],
        "acceptance_length": acceptance.get("avg"),
    }


def run_spectool(url: str, model: str, prompts, args, out: Path, seed: int) -> dict:  # noqa: ANN001
    from spectool.measure.client import RequestOptions
    from spectool.measure.runner import TrialConfig, measure

    if args.trace is not None:  # the trace's own send times, as tune's trace level
        times = [p.arrival_s for p in prompts]
        pace = {
            "rate_per_s": (len(times) - 1) / (times[-1] - times[0]),
            "arrivals_s": tuple(t - times[0] for t in times),
        }
    elif args.open_loop:
        pace = {"rate_per_s": args.rate}
    else:
        pace = {"concurrency": args.concurrency}
    config = TrialConfig(
        label=f"spectool client #{seed}",
        num_prompts=len(prompts) if args.trace is not None else args.requests,
        max_tokens=args.max_tokens,
        seed=seed,
        request=RequestOptions(),
        **pace,
    )
    (trial,) = measure(
        url, model, prompts, [config], results_path=out / "trials.jsonl", poll_metrics=False
    )
    summary = trial.latency()
    assert summary.ttft_s is not None
    assert summary.tpot_s is not None
    return {
        "ttft_mean_ms": summary.ttft_s.mean * 1000,
        "ttft_p50_ms": summary.ttft_s.p50 * 1000,
        "tpot_mean_ms": summary.tpot_s.mean * 1000,
        "errors": summary.errors,
    }


def write_poisson_trace(path: Path, prompts, args) -> Path:  # noqa: ANN001
    """The prompts as mooncake ``text_input`` rows at Poisson send times of ``args.rate``."""
    import random

    rng = random.Random(0)  # noqa: S311 (a reproducible schedule, not a secret)
    t_ms, rows = 0.0, []
    for p in prompts:
        rows.append(
            {"timestamp": round(t_ms, 3), "text_input": p.text, "output_length": args.max_tokens}
        )
        t_ms += rng.expovariate(args.rate) * 1000.0
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--aiperf", default="aiperf", help="the aiperf executable")
    parser.add_argument("--rate", type=float, default=4.0, help="AIPerf's pace, requests per s")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("out/aiperf"))
    parser.add_argument("--open-loop", action="store_true", help="spectool paced at --rate too")
    parser.add_argument("--trace", type=Path, help="a mooncake trace both tools replay")
    parser.add_argument(
        "--poisson-trace",
        action="store_true",
        help="write OUT/trace.jsonl (built-in prompts as text_input at Poisson --rate) and "
        "replay it in both tools, speculation on",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    literal = args.poisson_trace  # the trace carries the texts: keep speculation on

    from spectool.measure.client import tokenizer_counter
    from spectool.tuning.prompts import tune_prompts

    models = REPO_ROOT / "spectool" / "assets" / "models"
    target = models / "demo-target"
    built = tune_prompts(
        None, args.requests, count_tokens=tokenizer_counter(target), max_prompt_tokens=900, seed=0
    )
    prompts = list(built.prompts)  # each request asks for --max-tokens (the trial's length)
    if args.poisson_trace:
        args.trace = write_poisson_trace(args.out / "trace.jsonl", prompts, args)
    if args.trace is not None:
        from spectool.measure.workload_files import read_workload

        prompts = list(read_workload(args.trace, count_tokens=tokenizer_counter(target)).prompts)
    prompt_file = args.out / "prompts.jsonl"
    prompt_file.write_text(
        "".join(
            json.dumps({"text": p.text, "output_length": args.max_tokens}) + "\n" for p in prompts
        )
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spectool.cli.app",
            "serve",
            "--engine",
            "torch",
            *(["--method", "none"] if args.trace is not None and not literal else []),
            "--port",
            str(port),
        ],
        stdout=(args.out / "server.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    rows: dict[str, list[dict]] = {"aiperf": [], "spectool": []}
    try:
        wait_healthy(url)
        for r in range(args.rounds):  # A B, B A: neither tool always runs first
            runs = {
                "aiperf": lambda r=r: run_aiperf(
                    args.aiperf, url, "demo-target", target, prompt_file, args,
                    args.out / f"aiperf-{r}",
                ),
                "spectool": lambda r=r: run_spectool(
                    url, "demo-target", prompts, args, args.out, seed=r
                ),
            }  # fmt: skip
            for tool in ("aiperf", "spectool") if r % 2 == 0 else ("spectool", "aiperf"):
                rows[tool].append(runs[tool]())
            print(
                f"round {r}: aiperf {rows['aiperf'][-1]}\n         spectool {rows['spectool'][-1]}",
                flush=True,
            )
    finally:
        server.terminate()
        server.wait(timeout=60)

    def median(tool: str, key: str) -> float:
        return statistics.median(row[key] for row in rows[tool])

    checks = {}
    print(f"\n{'':16}{'AIPerf':>10}{'spectool':>10}{'ratio':>8}  per round (paired)")
    for key, name in (
        ("ttft_mean_ms", "TTFT mean ms"),
        ("ttft_p50_ms", "TTFT p50 ms"),
        ("tpot_mean_ms", "TPOT mean ms"),
    ):
        # each round's spectool / AIPerf ratio (the two ran back to back, so the machine's
        # drift between rounds cancels), and their median
        ratios = [s[key] / a[key] for a, s in zip(rows["aiperf"], rows["spectool"], strict=True)]
        ratio = statistics.median(ratios)
        a, s = median("aiperf", key), median("spectool", key)
        each = " ".join(f"{r:.3f}" for r in ratios)
        print(f"{name:16}{a:10.2f}{s:10.2f}{ratio:8.3f}  {each}")
        if key != "ttft_p50_ms":
            checks[f"{name} within 10%"] = abs(ratio - 1.0) <= AGREE
    acceptance = [row["acceptance_length"] for row in rows["aiperf"]]
    print(f"AIPerf acceptance length per round: {acceptance}")
    if args.trace is None or literal:  # a synthesised trace runs without speculation
        checks["AIPerf reports the acceptance length"] = all(
            a is not None and a > 1.0 for a in acceptance
        )
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}: {name}")
    (args.out / "aiperf_vs_spectool.json").write_text(
        json.dumps({"rows": rows, "checks": checks}, indent=1)
    )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
