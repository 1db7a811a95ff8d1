"""Where the embedded engine's forwards spend their time: a prefill, a batched decode step and a
batch-1 decode step of the demo target, split by the C step's own profile into the layers'
weight products and the rest (attention, norms, rotary, activations).

    python benchmarks/forward_parts.py [--rounds 3] [--prefill-tokens 233] [--context 200]
        [--batch 16] [--against OTHER_CHECKOUT --pairs 4] [--json]

Each round times one request's prefill (``--prefill-tokens`` random tokens, one output token),
then ``--batch`` requests and one request decoding at about ``--context`` tokens (10 steps
each); the figures are medians over rounds, ms per forward. ``--against`` compares this
checkout with another one (a worktree of an older commit, say) in separate processes, the two
alternating pair by pair (the C step is built once per source, so each process loads its own
tree's kernel), and prints both sides' figures per pair: a machine whose speed drifts by tens of
percent within minutes moves both sides of a pair alike. Needs the C step (x86-64 with AVX2 and
a C compiler), 1 thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
# the checkout whose spectool is measured: this one, or the one --against runs this file on
sys.path.insert(0, os.environ.get("FORWARD_PARTS_TREE", str(HERE.parents[1])))

FIELDS = ("prefill", "prefill_products", "batch", "batch_products", "one", "one_products")


def measure(rounds: int, prefill_tokens: int, context: int, batch: int) -> dict[str, float]:
    """Medians over ``rounds`` of ms per forward (whole C call, and its layers' products)."""
    import torch

    from spectool.builtin_models import builtin_path
    from spectool.engine import native_step
    from spectool.engine.engine import Engine, EngineConfig, SamplingParams

    torch.set_num_threads(1)
    seq = max(prefill_tokens, context + 64) + 8
    config = EngineConfig(max_batch_size=max(batch, 1), max_seq_len=seq)
    engine = Engine(builtin_path("demo-target"), config=config)
    if engine.target.native is None:
        raise SystemExit(f"no C step here: {native_step.unavailable_reason()}")
    gen = torch.Generator().manual_seed(0)

    def prompt(n: int) -> list[int]:
        return torch.randint(5, 4000, (n,), generator=gen).tolist()

    def finish(ids: set[int]) -> None:
        while ids:
            ids -= {e.request_id for e in engine.step() if e.finished}

    runs: dict[str, list[float]] = {name: [] for name in FIELDS}
    for _ in range(rounds):
        native_step.profile(True)
        finish({engine.add_request(prompt(prefill_tokens), SamplingParams(max_tokens=1))})
        p = native_step.profile(False)
        runs["prefill"].append(p.forwards * 1e3 / p.calls)
        runs["prefill_products"].append(p.layer_products * 1e3 / p.calls)
        for rows, name in ((batch, "batch"), (1, "one")):
            params = SamplingParams(max_tokens=rows + 16, ignore_eos=True)
            ids = {engine.add_request(prompt(context), params) for _ in range(rows)}
            for _ in range(rows + 2):  # the prefills (one request a step) and a first decode
                engine.step()
            native_step.profile(True)
            for _ in range(10):
                engine.step()
            p = native_step.profile(False)
            runs[name].append(p.forwards * 1e3 / p.calls)
            runs[name + "_products"].append(p.layer_products * 1e3 / p.calls)
            finish(ids)
    return {name: round(statistics.median(v), 3) for name, v in runs.items()}


def line(label: str, r: dict[str, float]) -> str:
    def part(name: str) -> str:
        whole, products = r[name], r[name + "_products"]
        return f"{whole:7.3f} ({products:.3f} + {whole - products:.3f})"

    return f"{label:>10} prefill {part('prefill')}  batch {part('batch')}  one {part('one')}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefill-tokens", type=int, default=233)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--against", type=Path, default=None, help="another checkout")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="one JSON line (this checkout)")
    args = parser.parse_args()
    sizes = (args.rounds, args.prefill_tokens, args.context, args.batch)
    if args.against is None:
        result = measure(*sizes)
        print(json.dumps(result) if args.json else line("this", result))
        return 0
    flags = [f"--rounds={args.rounds}", f"--prefill-tokens={args.prefill_tokens}"]
    flags += [f"--context={args.context}", f"--batch={args.batch}", "--json"]
    trees = {"this": HERE.parents[1], "against": args.against.resolve()}
    print("ms per forward: whole (layers' products + the rest), medians of rounds")
    for pair in range(args.pairs):
        order = list(trees) if pair % 2 == 0 else list(trees)[::-1]
        for label in order:
            env = os.environ | {"FORWARD_PARTS_TREE": str(trees[label])}
            out = subprocess.run(
                [sys.executable, str(HERE), *flags],
                env=env,
                cwd=trees[label],
                capture_output=True,
                text=True,
                check=True,
            )
            print(line(f"{label} {pair + 1}", json.loads(out.stdout.strip().splitlines()[-1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
