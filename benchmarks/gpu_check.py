"""The embedded engine on CUDA in one short run (meant for <= 5 minutes on any CUDA machine).

1. Greedy identity: the demo target's greedy tokens on CUDA against the CPU's, 16 prompts.
2. Decode tokens/s after the first token at batch 1 and batch 16 (method ``none``).
3. The speculative speed-up at batch 1 against its bound E / (1 + k c) (issue 27's target:
   at least 0.9 of it for draft_model and eagle3): ``draft_model``, ``eagle3`` and ``ngram``
   (k=4) over ``none`` in interleaved rounds (order rotating), as ``benchmarks/spec_bound.py``
   measures it on the CPU, with E and c from the engine's iteration stats on the device.

Float32 on both devices with TF32 off, so the GPU's products are float32 like the CPU's; a
different reduction order can still flip a near-tie, so a difference is reported with the first
token where it happens. Exit 1 when any prompt differs, 0 otherwise.

    python benchmarks/gpu_check.py [--device cuda] [--rounds 3] [--max-tokens 64]

``--device cpu`` runs the same script on the CPU (a smoke test of the script itself; identity is
then trivially CPU against CPU).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import spec_bound  # noqa: E402

from benchmarks.engine_speed import default_model, first_difference, make_prompts  # noqa: E402


def decode_rate(engine: object, prompts: list[list[int]], n: int) -> tuple[list[list[int]], float]:
    """Run ``prompts`` together (one batch); outputs and decode tokens/s after every request's
    first token."""
    from spectool.engine.engine import SamplingParams

    params = SamplingParams(max_tokens=n, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]  # type: ignore[attr-defined]
    outputs: dict[int, list[int]] = {i: [] for i in ids}
    remaining, started, tokens = set(ids), 0.0, 0
    while remaining:
        events = engine.step()  # type: ignore[attr-defined]
        for e in events:
            if started:
                tokens += len(e.token_ids)
            outputs[e.request_id].extend(e.token_ids)
            if e.finished:
                remaining.discard(e.request_id)
        if not started and all(outputs[i] for i in ids):
            engine._sync()  # type: ignore[attr-defined]
            started = time.perf_counter()
    engine._sync()  # type: ignore[attr-defined]
    return [outputs[i] for i in ids], tokens / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()

    import torch

    from spectool.engine.engine import Engine, EngineConfig

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible to torch", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    target, drafter = default_model("demo-target"), default_model("demo-drafter")
    if target is None or drafter is None:
        print("gpu_check: demo models not found", file=sys.stderr)
        return 2
    n = args.max_tokens
    seq_len = 64 + n + args.k + 8

    def engine(method: str, device: str, batch: int) -> Engine:
        return Engine(
            target,
            drafter if method == "draft_model" else None,
            EngineConfig(
                method=method,
                max_draft_len=args.k,
                max_batch_size=batch,
                max_seq_len=seq_len,
                device=device,
            ),
        )

    t0 = time.perf_counter()
    cpu, dev = engine("none", "cpu", args.prompts), engine("none", args.device, args.prompts)
    prompts = make_prompts(cpu.tokenizer, args.prompts, 64, cpu.vocab_size)
    ref = [decode_rate(cpu, [p], n)[0][0] for p in prompts]
    got = [decode_rate(dev, [p], n)[0][0] for p in prompts]
    diffs = [first_difference(a, b) for a, b in zip(got, ref, strict=True)]
    same = sum(d == "identical" for d in diffs)
    print(
        f"device {args.device} ({torch.cuda.get_device_name() if 'cuda' in args.device else 'cpu'})"
    )
    print(f"greedy identity vs CPU, batch 1: {same}/{len(prompts)} prompts identical")
    for i, d in enumerate(diffs):
        if d != "identical":
            print(f"  prompt {i}: {d}")
    batched, rate16 = decode_rate(dev, prompts, n)
    same16 = sum(a == b for a, b in zip(batched, ref, strict=True))
    print(f"greedy identity vs CPU, batch {len(prompts)}: {same16}/{len(prompts)} identical")
    rate1 = statistics.median(decode_rate(dev, [p], n)[1] for p in prompts[:4])
    print(f"decode tokens/s: batch 1 {rate1:.1f}, batch {len(prompts)} {rate16:.1f}")

    methods = ["draft_model", "eagle3", "ngram"]
    runners = spec_bound.make_engines(methods, args.k, seq_len, args.device)
    runs = spec_bound.interleaved(runners, prompts[:4], args.rounds, n)
    print(f"speculative speed-up at batch 1, k={args.k}, against E / (1 + k c):")
    met = True
    for m in methods:
        bound = spec_bound.bound_of(runs["none"], runs[m], args.k)
        print("\n".join(spec_bound.report(m, bound, args.k)))
        if m != "ngram":
            met &= bound.median("efficiency") >= spec_bound.EFFICIENCY_TARGET
    print(
        f"efficiency >= {spec_bound.EFFICIENCY_TARGET} for draft_model and eagle3: "
        f"{'met' if met else 'NOT met'}"
    )
    print(f"gpu_check: {time.perf_counter() - t0:.0f} s")
    return 0 if same == len(prompts) and same16 == len(prompts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
