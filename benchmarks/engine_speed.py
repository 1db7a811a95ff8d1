"""Speed targets of the embedded engine on CPU: batch 1, greedy, float32, against transformers.

1. The engine's baseline decode (method ``none``) reaches >= 1.5x the tokens/s of transformers'
   ``generate()`` on the same checkpoint.
2. The engine's speculative decode (``draft_model``, k drafts) reaches >= 2x transformers'
   assisted generation (``assistant_model=drafter``, k assistant tokens, constant schedule,
   dynamic speculation off).
3. Report: the engine's speculative speedup over its own baseline per k and batch size, which
   should win at small batches and shows where it stops winning.

Both sides get the same prompts (windows of standard-library source, what the demo pair was
trained on), max_new_tokens, dtype (float32) and torch thread count; end of sequence is ignored
on both, so every request generates exactly max_new_tokens tokens. A batch-1 run decodes
``--prompts`` prompts one after the other, so that acceptance is not one prompt's luck. Runs
are interleaved round by round (the order rotates each round) so that load from other processes
hits all sides alike; tokens/s = generated tokens / time of the whole call (prefill included),
reported as medians; a ratio is the median of the per-round ratios. ``--clock cpu`` uses this
process's CPU time instead of wall time (steadier on a shared machine; both are printed).

transformers 5.x reads the assisted-generation knobs (``num_assistant_tokens``,
``num_assistant_tokens_schedule``, ``assistant_confidence_threshold``) from the *assistant's*
``generation_config``, so they are set there; forward hooks count both models' forwards to
show that k drafts per round really happened. Use one thread (the default): with more threads
than free cores, OpenMP's waiting dominates both sides.

    python benchmarks/engine_speed.py [--target DIR] [--drafter DIR] [--k 4] [--max-tokens 128]
        [--prompts 4] [--repeats 5] [--threads 1] [--clock wall|cpu] [--sweep-ks 1-6]
        [--batches 1,2,4,8,16,32] [--sweep-repeats 3] [--no-sweep | --sweep-only]
        [--no-pack-fp16]

The demo checkpoints are float16: by default the engine multiplies by packed float16 copies of
their weights (fbgemm; arithmetic in float32, same values as the float32 weights transformers
uses), and the decoder layers run in one C call (``spectool.engine.native_step``) where it
builds; ``--no-pack-fp16`` runs every product on torch.mm instead (no C step either), to see
the kernels' share.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BASELINE_TARGET = 1.5  # engine baseline / transformers generate()
SPECULATIVE_TARGET = 2.0  # engine speculative / transformers assisted generation
# Source text for prompts: the demo pair was trained on Python's standard library.
PROMPT_SOURCES: tuple[str, ...] = ("textwrap.py", "argparse.py", "json/decoder.py")
PROMPT_WINDOWS = 64  # windows the source text is cut into (more if more prompts are asked)

Runner = Callable[[], list[list[int]]]


def parse_int_list(text: str) -> list[int]:
    """``"1-6"`` -> [1..6]; ``"1,2,4"`` -> [1, 2, 4]."""
    values: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            values.extend(range(int(lo), int(hi) + 1))
        else:
            values.append(int(part))
    return values


def default_model(name: str) -> Path | None:
    from spectool.ckpt.refs import builtin_path
    from spectool.errors import CheckpointError

    try:
        return builtin_path(name)
    except CheckpointError:
        return None


def make_prompts(tokenizer: Any, count: int, length: int, vocab_size: int) -> list[list[int]]:
    """``count`` different prompts of ``length`` tokens: windows of standard-library source.

    The text is cut into ``max(count, PROMPT_WINDOWS)`` evenly spaced windows, each starting
    half a stride in (the text opens with licence comments, on which a small model's greedy
    output is one repeated line, every draft accepted), taken in a fixed shuffled order: the
    first prompts are the same whatever ``count`` is, and spread over the whole text.
    """
    import random

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "\n".join((stdlib / name).read_text(encoding="utf-8") for name in PROMPT_SOURCES)
    ids = [t for t in tokenizer.encode(text, add_special_tokens=False) if 0 <= t < vocab_size]
    windows = max(count, PROMPT_WINDOWS)
    stride = max(1, (len(ids) - length) // windows)
    order = random.Random(0).sample(range(windows), windows)
    prompts = [ids[i * stride + stride // 2 :][:length] for i in order[:count]]
    if any(len(p) < length for p in prompts) or len(set(ids)) < 16:
        # A tokenizer that knows little of Python source (test models): seeded random ids.
        rng = random.Random(0)
        prompts = [[rng.randrange(2, vocab_size) for _ in range(length)] for _ in range(count)]
    return prompts


@dataclass
class Timings:
    """Seconds per runner per round: wall clock and this process's CPU time (one thread, so
    CPU time is the time the run was on a core; it leaves out time taken by other processes)."""

    wall: dict[str, list[float]]
    cpu: dict[str, list[float]]

    def pick(self, clock: str) -> dict[str, list[float]]:
        return self.wall if clock == "wall" else self.cpu


def profile_target_forwards(engine: Any) -> list[tuple[int, float, Any]]:
    """From now on, every forward of ``engine``'s target on the C step is profiled by the
    kernel (``spectool.engine.native_step.profile``, on only inside it, so the drafter's
    forwards are not counted): the list returned gets ``(rows, wall seconds, Profile)`` per
    forward. ``del engine.target.native.forward`` ends it (the bound method again)."""
    from spectool.engine import native_step

    native = engine.target.native
    inner = native.forward
    spent: list[tuple[int, float, Any]] = []

    def timed(tokens: Any, *args: Any) -> Any:
        native_step.profile(True)
        t0 = time.perf_counter()
        out = inner(tokens, *args)
        seconds = time.perf_counter() - t0
        spent.append((tokens.numel(), seconds, native_step.profile(False)))
        return out

    native.forward = timed
    return spent


def time_rounds(runners: dict[str, Runner], repeats: int) -> Timings:
    """Run every runner once per round, the order rotating every round."""
    names = list(runners)
    timings = Timings({name: [] for name in names}, {name: [] for name in names})
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            gc.collect()
            wall0, cpu0 = time.perf_counter(), time.process_time()
            runners[name]()
            timings.cpu[name].append(time.process_time() - cpu0)
            timings.wall[name].append(time.perf_counter() - wall0)
    return timings


def median_ratio(fast: list[float], slow: list[float]) -> float:
    """Median over rounds of ``slow time / fast time`` (= tokens/s ratio fast : slow)."""
    return statistics.median(s / f for f, s in zip(fast, slow, strict=True))


def first_difference(a: list[int], b: list[int]) -> str:
    if a == b:
        return "identical"
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"differ from token {i}"
    return "differ in length"


class ForwardCounter:
    """Counts forward calls of a transformers model (a hook on the module)."""

    def __init__(self, model: Any) -> None:
        self.calls = 0
        self._handle = model.register_forward_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.calls += 1

    def close(self) -> None:
        self._handle.remove()


def load_hf(folder: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    config = model.generation_config
    config.eos_token_id = None  # never stop early: exactly max_new_tokens, like ignore_eos
    config.pad_token_id = 0
    config.do_sample = False
    config.temperature = config.top_p = config.top_k = None
    return model


def kernel_summary(engine: Any) -> str:
    """Which kernel the engine's products run on (target, then drafter): the C step
    (spectool.engine.native_step) for the decoder layers and LM head, else each Projection's."""
    from spectool.engine.model import Projection

    parts = []
    for name, model in (("target", engine.target), ("drafter", engine.drafter)):
        if model is None:
            continue
        if model.native is not None:
            parts.append(f"{name} on the C step (float16 weights, float32 sums)")
            continue
        projections = [m for m in model.modules() if isinstance(m, Projection)]
        packed = sum(p.packed is not None for p in projections)
        parts.append(f"{name} {packed}/{len(projections)} on fbgemm float16 weights")
    return "; ".join(parts) + " (torch.mm, float32, for any product not named)"


def head_to_head(args: argparse.Namespace, target: Path, drafter: Path) -> tuple[bool, bool]:
    """Targets 1 and 2 at batch 1; returns (baseline passed, speculative passed).

    Each run decodes ``args.prompts`` prompts one after the other (batch 1), so that acceptance
    is not the luck of one prompt.
    """
    import torch

    from spectool.engine.engine import Engine, EngineConfig, SamplingParams

    n = args.max_tokens
    seq_len = args.prompt_tokens + n + args.k + 8
    pack = not args.no_pack_fp16
    base = Engine(
        target,
        config=EngineConfig(
            method="none", max_batch_size=1, max_seq_len=seq_len, pack_fp16_weights=pack
        ),
    )
    spec = Engine(
        target,
        drafter,
        EngineConfig(
            method="draft_model",
            max_draft_len=args.k,
            max_batch_size=1,
            max_seq_len=seq_len,
            pack_fp16_weights=pack,
        ),
    )
    hf_target, hf_drafter = load_hf(target), load_hf(drafter)
    assistant = hf_drafter.generation_config
    assistant.num_assistant_tokens = args.k
    assistant.num_assistant_tokens_schedule = "constant"
    assistant.assistant_confidence_threshold = 0.0  # 0 = no dynamic (confidence) early stop
    prompts = make_prompts(base.tokenizer, args.prompts, args.prompt_tokens, base.vocab_size)
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    inputs = [torch.tensor([prompt]) for prompt in prompts]

    def hf_run(assistant_model: Any) -> list[list[int]]:
        outputs = []
        with torch.inference_mode():
            for ids in inputs:
                out = hf_target.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=n,
                    do_sample=False,
                    use_cache=True,
                    assistant_model=assistant_model,
                )
                outputs.append(out[0, ids.shape[1] :].tolist())
        return outputs

    runners: dict[str, Runner] = {
        "engine baseline": lambda: [base.generate([p], params)[0] for p in prompts],
        "transformers generate": lambda: hf_run(None),
        "engine speculative": lambda: [spec.generate([p], params)[0] for p in prompts],
        "transformers assisted": lambda: hf_run(hf_drafter),
    }
    outputs = {name: run() for name, run in runners.items()}  # warm-up and correctness
    counters = (ForwardCounter(hf_target), ForwardCounter(hf_drafter))
    hf_run(hf_drafter)
    hf_target_calls, hf_drafter_calls = (c.calls for c in counters)
    for c in counters:
        c.close()
    spec.drain_stats()
    runners["engine speculative"]()
    stats = [s for s in spec.drain_stats() if s.num_requests_with_draft_tokens]
    accepted = sum(s.num_accepted_tokens for s in stats)
    drafted = sum(s.num_draft_tokens for s in stats)
    base.drain_stats()

    timings = time_rounds(runners, args.repeats)
    walls = timings.pick(args.clock)
    total = n * len(prompts)
    ref = outputs["transformers generate"]
    print(f"engine matrix products: {kernel_summary(spec)}")
    print(
        f"\nBatch 1, greedy, float32, {args.threads} thread(s), {len(prompts)} prompts of "
        f"{args.prompt_tokens} tokens, {n} new tokens each, k={args.k}, "
        f"{args.repeats} interleaved rounds, {args.clock} clock"
    )
    print(f"{'runner':24} {'median s':>9} {'tokens/s':>9}  outputs vs transformers generate()")
    for name, times in walls.items():
        med = statistics.median(times)
        same = [first_difference(o, r) for o, r in zip(outputs[name], ref, strict=True)]
        verdict = "identical" if all(x == "identical" for x in same) else "; ".join(same)
        print(f"{name:24} {med:9.3f} {total / med:9.1f}  {verdict}")
    print(
        f"engine speculative: {len(stats)} verify steps, {accepted}/{drafted} drafts accepted, "
        f"{(accepted + len(stats)) / max(len(stats), 1):.2f} tokens per verify forward"
    )
    # transformers has no separate prefill: every target forward verifies one round of drafts.
    print(
        f"transformers assisted: {hf_target_calls} target forwards, {hf_drafter_calls} drafter "
        f"forwards ({hf_drafter_calls / max(hf_target_calls, 1):.2f} per round; k={args.k}), "
        f"{total / max(hf_target_calls, 1):.2f} tokens per target forward"
    )
    base_ratio = median_ratio(walls["engine baseline"], walls["transformers generate"])
    spec_ratio = median_ratio(walls["engine speculative"], walls["transformers assisted"])
    other = "cpu" if args.clock == "wall" else "wall"
    again = timings.pick(other)
    print(
        f"same ratios on the {other} clock: baseline "
        f"{median_ratio(again['engine baseline'], again['transformers generate']):.2f}x, "
        f"speculative "
        f"{median_ratio(again['engine speculative'], again['transformers assisted']):.2f}x"
    )
    base_ok = base_ratio >= BASELINE_TARGET
    spec_ok = spec_ratio >= SPECULATIVE_TARGET
    print(
        f"target 1: engine baseline / transformers generate()  = {base_ratio:.2f}x "
        f"(target >= {BASELINE_TARGET}x) {'PASS' if base_ok else 'MISS'}"
    )
    print(
        f"target 2: engine speculative / transformers assisted = {spec_ratio:.2f}x "
        f"(target >= {SPECULATIVE_TARGET}x) {'PASS' if spec_ok else 'MISS'}"
    )
    return base_ok, spec_ok


def sweep(args: argparse.Namespace, target: Path, drafter: Path) -> bool:
    """Target 3: engine speculative / engine baseline per batch size and k; True if it wins at
    batch 1 for some k.

    At batch size B every engine admits at most B requests at once and decodes the same
    ``max(B, args.prompts)`` prompts (so batch 1 runs them one after the other): small batches
    average acceptance over several prompts instead of depending on one.
    """
    from spectool.engine.engine import Engine, EngineConfig, SamplingParams

    ks, batches = args.sweep_ks, args.batches
    n = args.max_tokens
    seq_len = args.prompt_tokens + n + max(ks) + 8
    tokenizer_engine = Engine(target, config=EngineConfig(max_batch_size=1, max_seq_len=seq_len))
    all_prompts = make_prompts(
        tokenizer_engine.tokenizer,
        max(max(batches), args.prompts),
        args.prompt_tokens,
        tokenizer_engine.vocab_size,
    )
    del tokenizer_engine
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    print(
        f"\nEngine speculative speedup over its own baseline (tokens/s ratio, median of "
        f"{args.sweep_repeats} interleaved rounds, {args.clock} clock; {n} new tokens per "
        f"request, at least {args.prompts} requests per run)"
    )
    header = f"{'batch':>5} {'base tok/s':>10} " + " ".join(f"{f'k={k}':>6}" for k in ks)
    print(header + "  best      tokens per verify forward (k=1..)")
    wins_at_1 = False
    stopped: int | None = None
    pack = not args.no_pack_fp16
    for batch in batches:
        engines = {
            0: Engine(
                target,
                config=EngineConfig(
                    max_batch_size=batch, max_seq_len=seq_len, pack_fp16_weights=pack
                ),
            )
        }
        for k in ks:
            engines[k] = Engine(
                target,
                drafter,
                EngineConfig(
                    method="draft_model",
                    max_draft_len=k,
                    max_batch_size=batch,
                    max_seq_len=seq_len,
                    pack_fp16_weights=pack,
                ),
            )
        prompts = all_prompts[: max(batch, args.prompts)]
        runners: dict[str, Runner] = {
            str(k): (lambda e=engine, p=prompts: e.generate(p, params))
            for k, engine in engines.items()
        }
        for run in runners.values():
            run()  # warm-up
        accept_len: dict[int, float] = {}
        for k in ks:
            stats = [s for s in engines[k].drain_stats() if s.num_requests_with_draft_tokens]
            rows = sum(s.num_requests_with_draft_tokens for s in stats)
            accept_len[k] = 1 + sum(s.num_accepted_tokens for s in stats) / max(rows, 1)
        times = time_rounds(runners, args.sweep_repeats).pick(args.clock)
        base_tps = len(prompts) * n / statistics.median(times["0"])
        speedups = {k: median_ratio(times[str(k)], times["0"]) for k in ks}
        best = max(speedups, key=lambda k: speedups[k])
        cells = " ".join(f"{speedups[k]:6.2f}" for k in ks)
        accepts = " ".join(f"{accept_len[k]:.2f}" for k in ks)
        print(f"{batch:5d} {base_tps:10.1f} {cells}  k={best} ({speedups[best]:.2f}x)  {accepts}")
        if batch == 1:
            wins_at_1 = speedups[best] > 1.0
        if stopped is None and speedups[best] <= 1.0:
            stopped = batch
    where = f"stops winning at batch {stopped}" if stopped else "wins at every batch size tried"
    verdict = "PASS" if wins_at_1 else "MISS"
    print(f"target 3: speculative beats baseline at batch 1: {verdict}; {where}")
    return wins_at_1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=None, help="default: built-in demo-target")
    parser.add_argument("--drafter", type=Path, default=None, help="default: built-in demo-drafter")
    parser.add_argument("--k", type=int, default=4, help="draft length for targets 1-2")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=4, help="batch-1 prompts per run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sweep-ks", type=parse_int_list, default=parse_int_list("1-6"))
    parser.add_argument("--batches", type=parse_int_list, default=parse_int_list("1,2,4,8,16,32"))
    parser.add_argument("--sweep-repeats", type=int, default=3)
    parser.add_argument("--no-sweep", action="store_true", help="targets 1 and 2 only")
    parser.add_argument(
        "--no-pack-fp16",
        action="store_true",
        help="engine projections on torch.mm only (no fbgemm float16-weight kernel)",
    )
    parser.add_argument("--sweep-only", action="store_true", help="target 3 only")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time the ratios use: wall (default) or process CPU time (steadier on a shared box)",
    )
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    target = args.target or default_model("demo-target")
    drafter = args.drafter or default_model("demo-drafter")
    if target is None or drafter is None:
        print("the built-in demo pair is missing: pass --target and --drafter")
        return 2
    print(
        f"target {target}\ndrafter {drafter}\ntorch {torch.__version__}, {args.threads} thread(s)"
    )
    base_ok, spec_ok = (True, True) if args.sweep_only else head_to_head(args, target, drafter)
    sweep_ok = True if args.no_sweep else sweep(args, target, drafter)
    ok = base_ok and spec_ok and sweep_ok
    print("PASS" if ok else "MISS")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
