"""The embedded engine's speculative speed-up against its bound, at batch 1 (issue 27).

With k drafts a step, E tokens confirmed per target forward (accepted drafts + the bonus or
correction token) and a drafter step costing c target steps, speculation can at best reach
``E / (1 + k * c)`` times the baseline's speed (the verify pass priced as one target step).
An engine whose own per-step work (sampling, acceptance, cache bookkeeping, Python between
the forwards) is small gets close to it; this prints how close, for draft_model and eagle3.

Measured on the demo pair (float32 arithmetic, greedy, batch 1, 1 torch thread, prompts of
standard-library source as in ``benchmarks/engine_speed.py``), decode only (time after each
request's first token), rounds interleaved (baseline, draft_model, eagle3, order rotating):

* speed-up: spec decode tokens/s over baseline decode tokens/s, per round (paired);
* E: target forwards' confirmed tokens, from the engine's iteration stats;
* c: the proposer's time per drafted token (iteration stats ``draft_ms`` / drafts) over the
  baseline's time per decode step (``verify_ms``), the same round;
* efficiency: speed-up / bound, median and min-max over rounds; and against the bound with the
  verify pass priced at its measured cost v (in baseline forwards), ``E / (v + k c)``: what is
  left is the engine's own work around the forwards;
* on the C step, one more round with the target's forwards profiled by the kernel
  (``spectool.engine.native_step.profile``): the weight products of a verify pass of k + 1 rows
  against those of one row. A verify pass costs at least a baseline step plus its extra rows'
  products, v_min; no work around the products can then reach more than
  ``(1 + k c) / (v_min + k c)`` of the bound. That is the ceiling the kernel's arithmetic sets.

``--device cuda`` runs the same rounds on a GPU (the PyTorch path; ``benchmarks/gpu_check.py``
runs them there as part of its check), where a verify pass of k + 1 rows at batch 1 is nearer
one forward than on a CPU core.

    python benchmarks/spec_bound.py [--k 4] [--rounds 5] [--prompts 4] [--max-tokens 128]
                                    [--device cpu|cuda] [--methods draft_model,eagle3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

EFFICIENCY_TARGET = 0.9  # issue 27: speed-up >= 0.9 of the bound
DRAFTERS = {"draft_model": "demo-drafter", "eagle3": "demo-eagle3", "ngram": None}


def decode(engine: Any, prompts: list[list[int]], n: int) -> dict[str, float]:
    """Batch-1 greedy runs one after another: decode tokens and seconds after each request's
    first token, and the iteration stats' sums over those decode steps."""
    from spectool.engine.engine import SamplingParams

    params = SamplingParams(max_tokens=n, ignore_eos=True)
    out = {"tokens": 0.0, "seconds": 0.0, "steps": 0.0, "draft_ms": 0.0, "verify_ms": 0.0}
    out |= {"drafts": 0.0, "accepted": 0.0, "coord_ms": 0.0, "iter_ms": 0.0}
    engine.drain_stats()
    for prompt in prompts:
        rid = engine.add_request(prompt, params)
        count, start, first = 0, 0.0, 0
        while True:
            events = engine.step()
            count += sum(len(e.token_ids) for e in events if e.request_id == rid)
            if not start and count:
                start, first = time.perf_counter(), count
                engine.drain_stats()  # the prefill step is not a decode step
            if any(e.finished for e in events if e.request_id == rid):
                break
        out["seconds"] += time.perf_counter() - start
        out["tokens"] += count - first
        for it in engine.drain_stats():
            out["steps"] += 1
            out["draft_ms"] += it.draft_ms
            out["verify_ms"] += it.verify_ms
            out["coord_ms"] += it.coord_ms
            out["iter_ms"] += it.iter_latency_ms
            out["drafts"] += it.num_draft_tokens
            out["accepted"] += it.num_accepted_tokens
    return out


def make_engines(methods: list[str], k: int, seq_len: int, device: str) -> dict[str, Any]:
    """``none`` and one batch-1 engine per method on the demo target, on ``device``."""
    from spectool.builtin_models import builtin_path
    from spectool.engine.engine import Engine, EngineConfig

    target = builtin_path("demo-target")
    engines: dict[str, Any] = {
        "none": Engine(
            target, config=EngineConfig(max_batch_size=1, max_seq_len=seq_len, device=device)
        )
    }
    for method in methods:
        name = DRAFTERS[method]
        config = EngineConfig(
            method=method, max_draft_len=k, max_batch_size=1, max_seq_len=seq_len, device=device
        )
        engines[method] = Engine(target, builtin_path(name) if name else None, config)
    return engines


def interleaved(
    engines: dict[str, Any], prompts: list[list[int]], rounds: int, n: int
) -> dict[str, list[dict[str, float]]]:
    """``rounds`` rounds of :func:`decode` per engine, the order rotating each round (after a
    short warm-up of each)."""
    for engine in engines.values():
        decode(engine, prompts[:1], 8)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    names = list(engines)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            runs[name].append(decode(engines[name], prompts, n))
    return runs


@dataclass(frozen=True)
class Bound:
    """One method's rounds against the baseline's, each list one value per round."""

    speedup: list[float]
    e: list[float]  # tokens confirmed per target forward
    c: list[float]  # a draft's time over a baseline decode step's
    bound: list[float]  # E / (1 + k c)
    efficiency: list[float]  # speed-up / bound
    v: list[float]  # the verify pass in baseline forwards
    efficiency_v: list[float]  # speed-up / (E / (v + k c))
    parts: list[tuple[float, float, float, float]]  # drafting, verify, coord, rest (base steps)

    def median(self, name: str) -> float:
        return statistics.median(getattr(self, name))


def bound_of(base_runs: list[dict[str, float]], spec_runs: list[dict[str, float]], k: int) -> Bound:
    """The bound and the efficiencies of each round, paired with the baseline's round."""
    out = Bound([], [], [], [], [], [], [], [])
    for base, spec in zip(base_runs, spec_runs, strict=True):
        speedup = (spec["tokens"] / spec["seconds"]) / (base["tokens"] / base["seconds"])
        base_forward = base["verify_ms"] / base["steps"]
        e = spec["tokens"] / spec["steps"]
        c = (spec["draft_ms"] / spec["drafts"]) / base_forward if spec["drafts"] else 0.0
        bound = e / (1 + k * c)
        v = (spec["verify_ms"] / spec["steps"]) / base_forward
        base_step = base["seconds"] * 1e3 / base["steps"]
        spent = (spec["draft_ms"], spec["verify_ms"], spec["coord_ms"])
        rest = spec["seconds"] * 1e3 - sum(spent)
        out.speedup.append(speedup)
        out.e.append(e)
        out.c.append(c)
        out.bound.append(bound)
        out.efficiency.append(speedup / bound)
        out.v.append(v)
        out.efficiency_v.append(speedup / (e / (v + k * c)))
        per_step = [x / spec["steps"] / base_step for x in (*spent, rest)]
        out.parts.append((per_step[0], per_step[1], per_step[2], per_step[3]))
    return out


def report(method: str, b: Bound, k: int) -> list[str]:
    """The lines printed for one method."""
    eff = b.efficiency
    draft, verify, coord, rest = (statistics.median(p[i] for p in b.parts) for i in range(4))
    return [
        f"  {method:12s} speed-up {b.median('speedup'):.2f}x  E {b.median('e'):.2f}"
        f"  c {b.median('c'):.3f}  bound {b.median('bound'):.2f}x  "
        f"efficiency {b.median('efficiency'):.2f} ({min(eff):.2f}-{max(eff):.2f})",
        f"  {'':12s} a speculative step in baseline steps: drafting {draft:.2f}, verify "
        f"{verify:.2f}, acceptance and bookkeeping {coord:.2f}, the rest {rest:.2f} "
        f"(the bound counts {k}c = {k * b.median('c'):.2f} and 1)",
        f"  {'':12s} with the verify pass at its measured cost ({b.median('v'):.2f} "
        f"baseline forwards) the bound E / (v + k c) is met at {b.median('efficiency_v'):.2f} "
        f"({min(b.efficiency_v):.2f}-{max(b.efficiency_v):.2f}): the rest is the engine's own "
        "step",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--methods", default="draft_model,eagle3")
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    if unknown := [m for m in methods if m not in DRAFTERS]:
        parser.error(f"--methods: unknown {', '.join(unknown)} (known: {', '.join(DRAFTERS)})")

    import torch
    from engine_speed import make_prompts, profile_target_forwards

    torch.set_num_threads(1)
    seq = args.prompt_tokens + args.max_tokens + args.k + 8
    engines = make_engines(methods, args.k, seq, args.device)
    base = engines["none"]
    prompts = make_prompts(base.tokenizer, args.prompts, args.prompt_tokens, base.vocab_size)
    runs = interleaved(engines, prompts, args.rounds, args.max_tokens)
    print(
        f"Batch 1, k={args.k}, {args.prompts} prompts of {args.prompt_tokens} tokens, "
        f"{args.max_tokens} new tokens, {args.rounds} interleaved rounds, 1 thread, "
        f"device {args.device}"
    )
    ok = True
    on_c_step = base.target.native is not None
    if on_c_step:  # one more round, the target's products profiled (not in the timed rounds)
        forwards = {name: profile_target_forwards(engine) for name, engine in engines.items()}
        profiled = {name: decode(engines[name], prompts, args.max_tokens) for name in engines}
        products = {  # the weight products' seconds of each target forward, by its rows
            name: [(rows, p.layer_products + p.products) for rows, _, p in spent]
            for name, spent in forwards.items()
        }
        one_row = statistics.median(t for rows, t in products["none"] if rows == 1)
        base_ms = profiled["none"]["seconds"] * 1e3 / profiled["none"]["steps"]
    for method in methods:
        b = bound_of(runs["none"], runs[method], args.k)
        ok &= b.median("efficiency") >= EFFICIENCY_TARGET
        print("\n".join(report(method, b, args.k)))
        verify = [t for rows, t in products[method] if rows == args.k + 1] if on_c_step else []
        if verify:  # the verify pass costs at least a baseline step plus its extra rows' products
            verify_products = statistics.median(verify)
            v_min = 1 + (verify_products - one_row) * 1e3 / base_ms
            kc = args.k * b.median("c")
            print(
                f"  {'':12s} the C step's profile: the products of a verify pass of "
                f"{args.k + 1} rows take {verify_products * 1e3:.3f} ms, of one row "
                f"{one_row * 1e3:.3f} ms ({verify_products / one_row:.2f}x); so the verify "
                f"pass costs at least {v_min:.2f} baseline steps and no engine step around "
                f"these products reaches more than (1 + k c) / ({v_min:.2f} + k c) = "
                f"{(1 + kc) / (v_min + kc):.2f} of E / (1 + k c) (baseline step "
                f"{base_ms:.3f} ms in this round)"
            )
    print(
        f"target: efficiency >= {EFFICIENCY_TARGET} for every method: {'met' if ok else 'NOT met'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
