"""The embedded engine against llama.cpp on the same CPU core, with the matrix-work floor beside it.

What a CPU user would pick instead of spectool's engine is llama.cpp, so this is the bar:

1. The demo target is written to GGUF with the ``gguf`` package (F16 and F32 files; names and
   the q/k row permutation as ``LlamaModel.permute`` in llama.cpp's ``convert_hf_to_gguf.py``:
   Hugging Face's rotate-half rotary layout into GGML's interleaved one; checked by
   tests/test_bench_gguf_rotary.py against both rotations written out).
   Greedy tokens of both engines are compared on ``--prompts`` prompts (16 by default): token
   ids go in and come out on both sides, so tokenizers play no part.
2. Batch-1 greedy decode and prompt-lookup speculative decode (spectool's ``ngram`` proposer
   against llama-cpp-python's ``LlamaPromptLookupDecoding``, same k and longest n-gram) are timed
   in interleaved rounds (order rotating), same prompts, same thread count. The rate is decode
   tokens/s after the first token (the prefill is left out). Ratios are paired per round;
   the interval is the rounds' min..max, a distribution-free interval for the median (with R
   rounds it covers the median with probability 1 - 2 * 0.5**R: 94% at 5 rounds).
3. The floor: the target's weight products alone (every projection of every layer and the LM
   head, the engine's own kernels and weights) in a tight loop on the same thread(s): the
   fastest any engine could run one decode step on this core with these kernels. On the C step,
   the kernel's own profile splits the same decode steps into matrix work (the layers' products
   and the LM head, each timed as it runs) and the rest: the C layers' attention, norms, rotary
   and activations, the forward's Python, the engine's step around it. Step time minus the
   floor (the two timed apart, the floor with its weights hot in cache) is printed too, and a
   torch profile of one decode splits the PyTorch path's time by operator.
4. The batched curve: the engine's decode tokens/s at batch 1..32 beside the floor at each batch.

llama-cpp-python is an optional benchmark dependency (``pip install gguf llama-cpp-python``; it
compiles llama.cpp, about 18 minutes on 2 busy cores). Without it the floor, profile and curve still
run and the llama.cpp columns are skipped with the reason.

    python benchmarks/engine_vs_llamacpp.py [--rounds 5] [--prompts 16] [--max-tokens 128]
        [--prompt-tokens 64] [--threads 1] [--k 4] [--ngram 3] [--batches 1,2,4,8,16,32]
        [--no-llama] [--keep-gguf DIR]
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.engine_speed import (  # noqa: E402
    default_model,
    make_prompts,
    parse_int_list,
    profile_target_forwards,
)

# Decode rate: tokens after the first / seconds after the first; one entry per prompt.
Rate = tuple[int, float]


# -- GGUF export ----------------------------------------------------------------------------


def permute_rotary(weight: Any, n_head: int) -> Any:
    """Rows of a q/k projection from rotate-half to GGML's interleaved rotary layout
    (``LlamaModel.permute`` in llama.cpp's convert_hf_to_gguf.py)."""
    return (
        weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def export_gguf(folder: Path, out: Path, ftype: str) -> Path:
    """Write the Llama checkpoint in ``folder`` as GGUF (``ftype`` "f16" or "f32") at ``out``."""
    import json

    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if config["architectures"] != ["LlamaForCausalLM"]:
        raise SystemExit(f"{folder}: only LlamaForCausalLM is exported here")
    tensors: dict[str, Any] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(path))
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // n_head
    dtype = np.float16 if ftype == "f16" else np.float32
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(folder.name)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(
        gguf.LlamaFileType.MOSTLY_F16 if ftype == "f16" else gguf.LlamaFileType.ALL_F32
    )
    add_tokenizer(writer, folder, config)
    names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    writer.add_tensor("token_embd.weight", tensors["model.embed_tokens.weight"].astype(dtype))
    writer.add_tensor("output_norm.weight", tensors["model.norm.weight"].astype(np.float32))
    if "lm_head.weight" in tensors and not config.get("tie_word_embeddings"):
        writer.add_tensor("output.weight", tensors["lm_head.weight"].astype(dtype))
    for i in range(config["num_hidden_layers"]):
        for hf, gg in names.items():
            w = tensors[f"model.layers.{i}.{hf}.weight"]
            if hf == "self_attn.q_proj":
                w = permute_rotary(w, n_head)
            elif hf == "self_attn.k_proj":
                w = permute_rotary(w, n_kv)
            # norms stay float32, as llama.cpp's converter keeps 1-D tensors
            writer.add_tensor(
                f"blk.{i}.{gg}.weight", w.astype(dtype if w.ndim == 2 else np.float32)
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def add_tokenizer(writer: Any, folder: Path, config: dict[str, Any]) -> None:
    """GPT-2-style byte-level BPE vocabulary and merges from tokenizer.json (llama.cpp needs a
    vocabulary to load; the benchmark itself passes token ids)."""
    import json

    import gguf

    tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    tokens = [""] * config["vocab_size"]
    types = [gguf.TokenType.NORMAL] * config["vocab_size"]
    for text, i in vocab.items():
        tokens[i] = text
    for added in tok.get("added_tokens", []):
        tokens[added["id"]] = added["content"]
        types[added["id"]] = gguf.TokenType.CONTROL
    for i, text in enumerate(tokens):
        if not text:
            tokens[i], types[i] = f"[PAD{i}]", gguf.TokenType.UNUSED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_add_bos_token(False)


# -- runners --------------------------------------------------------------------------------


def engine_decode(engine: Any, prompts: list[list[int]], n: int) -> tuple[list[list[int]], Rate]:
    """Batch-1 greedy runs of ``prompts`` one after another; outputs and (tokens, seconds)
    after each request's first token."""
    from spectool.engine.engine import SamplingParams

    params = SamplingParams(max_tokens=n, ignore_eos=True)
    outputs, tokens, seconds = [], 0, 0.0
    for prompt in prompts:
        rid = engine.add_request(prompt, params)
        out: list[int] = []
        start = None
        while True:
            events = engine.step()
            for event in events:
                if event.request_id == rid:
                    out.extend(event.token_ids)
            if start is None and out:
                start, first = time.perf_counter(), len(out)
            if any(e.finished for e in events if e.request_id == rid):
                break
        seconds += time.perf_counter() - start  # type: ignore[operator]
        tokens += len(out) - first
        outputs.append(out)
    return outputs, (tokens, seconds)


def llama_decode(llm: Any, prompts: list[list[int]], n: int) -> tuple[list[list[int]], Rate]:
    """The same with llama-cpp-python's generator (greedy, no penalties, no stop on EOS)."""
    outputs, tokens, seconds = [], 0, 0.0
    for prompt in prompts:
        out: list[int] = []
        start = 0.0
        gen = llm.generate(
            prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True
        )
        for token in gen:
            out.append(int(token))
            if len(out) == 1:
                start = time.perf_counter()
            if len(out) == n:
                break
        gen.close()
        seconds += time.perf_counter() - start
        tokens += len(out) - 1
        outputs.append(out)
    return outputs, (tokens, seconds)


def count_calls(llm: Any) -> list[int]:
    """Count llama.cpp forward calls (``Llama.eval``) of ``llm``: tokens per call."""
    calls = [0]
    inner = llm.eval

    def counted(tokens: Any) -> None:
        calls[0] += 1
        inner(tokens)

    llm.eval = counted
    return calls


def rounds(runners: dict[str, Callable[[], Rate]], count: int) -> dict[str, list[float]]:
    """Decode tokens/s per runner per round, the order rotating each round."""
    names = list(runners)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for r in range(count):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            gc.collect()
            tokens, seconds = runners[name]()
            rates[name].append(tokens / seconds)
    return rates


def paired(a: list[float], b: list[float]) -> str:
    """Median of per-round ratios a/b with the rounds' min..max."""
    ratios = sorted(x / y for x, y in zip(a, b, strict=True))
    cover = 1 - 2 * 0.5 ** len(ratios)
    return (
        f"{statistics.median(ratios):.2f}x (rounds {ratios[0]:.2f}-{ratios[-1]:.2f}, "
        f"{cover:.0%} interval for the median)"
    )


# -- floor and profile ----------------------------------------------------------------------


def matrix_floor(model: Any, batch: int, repeats: int = 30) -> float:
    """Seconds for one pass of every weight product of ``model`` at ``batch`` rows (the
    engine's own kernels: the C step's product where the model runs on it, else the
    Projections'), the best of ``repeats`` passes' medians."""
    import torch

    from spectool.engine.model import Projection

    products: list[Callable[[], Any]] = []
    if model.native is not None:
        for w in model.native.weights():
            x, y = torch.randn(batch, w.shape[1]), torch.empty(batch, w.shape[0])
            products.append(functools.partial(model.native.product, x, w, y))
    else:
        for p in model.modules():
            if isinstance(p, Projection):
                products.append(functools.partial(p.forward, torch.randn(batch, p.weight.shape[0])))
    for product in products:
        product()
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(10):
                for product in products:
                    product()
            times.append((time.perf_counter() - t0) / 10)
    return statistics.median(sorted(times)[: max(1, repeats // 2)])


def profile_step(engine: Any, prompt: list[int], n: int) -> list[tuple[str, float]]:
    """Self CPU time per operator (ms per decode step) over one batch-1 decode."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine_decode(engine, [prompt], n)
    rows = [(e.key, e.self_cpu_time_total / 1000 / n) for e in prof.key_averages()]
    return sorted(rows, key=lambda r: -r[1])


def native_split(engine: Any, prompt: list[int], n: int) -> dict[str, float]:
    """Where a batch-1 decode step's time goes when the target runs on the C step, in the same
    steps (the kernel's own profile, two clock reads per product): milliseconds per decode step
    (the first token's prefill excluded) of the whole step, the model's forward (embedding, the
    C layers, the LM head), the C layers, and the weight products inside them and in the LM
    head, over one decode of ``n`` tokens."""
    spent = profile_target_forwards(engine)
    try:
        _, (tokens, seconds) = engine_decode(engine, [prompt], n)
    finally:
        del engine.target.native.forward  # the bound method again
    steps = spent[-tokens:]  # one forward per decode step after the first token
    per_step = {
        "step": seconds / tokens,
        "forward": sum(t for _, t, _ in steps) / tokens,
        "c_layers": sum(p.forwards for _, _, p in steps) / tokens,
        "layer_products": sum(p.layer_products for _, _, p in steps) / tokens,
        "head_product": sum(p.products for _, _, p in steps) / tokens,
    }
    return {key: value * 1e3 for key, value in per_step.items()}


MATRIX_OPS = ("aten::fbgemm_linear_fp16_weight", "aten::mm", "aten::addmm", "aten::linear")


def batched_curve(target: Path, prompts: list[list[int]], batches: list[int], n: int) -> None:
    """Engine decode tokens/s at each batch size beside the matrix floor at that batch."""
    from spectool.engine.engine import Engine, EngineConfig, SamplingParams

    engine = Engine(
        target, config=EngineConfig(method="none", max_batch_size=max(batches), max_seq_len=512)
    )
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    print(f"\nBatched greedy decode (engine, method none), {n} new tokens per request")
    print(f"{'batch':>5} {'engine tok/s':>13} {'floor tok/s':>12} {'engine/floor':>13}")
    for b in batches:
        group = (prompts * (b // len(prompts) + 1))[:b]
        ids = [engine.add_request(p, params) for p in group]
        remaining, started, tokens = set(ids), None, 0
        while remaining:
            events = engine.step()
            if started is None and len(events) == b:  # every request has its first token
                started = time.perf_counter()
                continue
            for e in events:
                tokens += len(e.token_ids) if started is not None else 0
                if e.finished:
                    remaining.discard(e.request_id)
        rate = tokens / (time.perf_counter() - started)  # type: ignore[operator]
        floor = b / matrix_floor(engine.target, b)
        print(f"{b:5d} {rate:13.1f} {floor:12.1f} {rate / floor:13.2f}")


# -- main -----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--ngram", type=int, default=3, help="longest n-gram matched")
    parser.add_argument("--batches", type=parse_int_list, default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--no-llama", action="store_true", help="floor, profile, curve only")
    parser.add_argument("--keep-gguf", type=Path, default=None, help="write the GGUF files here")
    args = parser.parse_args()

    import torch

    from spectool.engine.engine import Engine, EngineConfig

    torch.set_num_threads(args.threads)
    target = args.target or default_model("demo-target")
    if target is None:
        raise SystemExit("no demo target: pass --target DIR")
    n = args.max_tokens
    seq_len = args.prompt_tokens + n + args.k + 8
    base = Engine(target, config=EngineConfig(method="none", max_batch_size=1, max_seq_len=seq_len))
    ngram = Engine(
        target,
        config=EngineConfig(
            method="ngram",
            max_draft_len=args.k,
            ngram_max_matching=args.ngram,
            max_batch_size=1,
            max_seq_len=seq_len,
        ),
    )
    prompts = make_prompts(base.tokenizer, args.prompts, args.prompt_tokens, base.vocab_size)
    ref, _ = engine_decode(base, prompts, n)
    spec_out, _ = engine_decode(ngram, prompts, n)
    print(
        f"engine ngram vs engine greedy: {sum(a == b for a, b in zip(ref, spec_out, strict=True))}/"
        f"{len(prompts)} prompts identical"
    )

    runners: dict[str, Callable[[], Rate]] = {
        "engine greedy": lambda: engine_decode(base, prompts, n)[1],
        "engine ngram": lambda: engine_decode(ngram, prompts, n)[1],
    }
    llama_note = llama_setup(args, target, prompts, ref, runners)

    ngram.drain_stats()
    engine_decode(ngram, prompts, n)
    stats = [s for s in ngram.drain_stats() if s.num_decoded_requests]
    engine_tpc = sum(s.num_accepted_tokens + 1 for s in stats) / len(stats)
    rates = rounds(runners, args.rounds)
    print(
        f"\nBatch 1, {args.threads} thread(s), {len(prompts)} prompts of {args.prompt_tokens} "
        f"tokens, {n} new tokens each, decode tokens/s after the first token, {args.rounds} "
        f"interleaved rounds (median, min-max)"
    )
    for name, values in rates.items():
        print(
            f"  {name:22} {statistics.median(values):8.1f}  ({min(values):.1f}-{max(values):.1f})"
        )
    print(f"  engine ngram: {engine_tpc:.2f} tokens per target forward (k={args.k})")
    if llama_note:
        print(f"  llama.cpp: {llama_note}")
    for ours, theirs in (
        ("engine greedy", "llama.cpp F16 greedy"),
        ("engine greedy", "llama.cpp F32 greedy"),
        ("engine ngram", "llama.cpp F16 prompt lookup"),
    ):
        if theirs in rates:
            print(f"  {ours} / {theirs}: {paired(rates[ours], rates[theirs])}")

    floor = matrix_floor(base.target, 1)
    step = 1 / statistics.median(rates["engine greedy"])
    print(
        f"\nMatrix floor at batch 1 (every projection + LM head, engine kernels): "
        f"{floor * 1e3:.3f} ms/token = {1 / floor:.0f} tokens/s; engine step {step * 1e3:.3f} ms; "
        f"outside matrix work {(step - floor) * 1e3:.3f} ms ({(step - floor) / step:.0%} of the step)"
    )
    if base.target.native is not None:
        split = [native_split(base, prompts[0], n) for _ in range(3)]
        ms = {key: statistics.median(s[key] for s in split) for key in split[0]}
        matrix = ms["layer_products"] + ms["head_product"]
        print(
            f"C step's own profile (spectool.engine.native_step.profile), batch-1 decode, median "
            f"of 3 decodes of {n} tokens, ms per step: whole step {ms['step']:.3f} = matrix "
            f"work {matrix:.3f} (layers {ms['layer_products']:.3f}, LM head "
            f"{ms['head_product']:.3f}) + outside matrix work {ms['step'] - matrix:.3f}: "
            f"attention, norms, rotary, activations in C "
            f"{ms['c_layers'] - ms['layer_products']:.3f}, the forward's Python (embedding, "
            f"buffers) {ms['forward'] - ms['c_layers'] - ms['head_product']:.3f}, the engine's "
            f"step around it (sampling, scheduling, bookkeeping) "
            f"{ms['step'] - ms['forward']:.3f}"
        )
    rows = profile_step(base, prompts[0], n)
    total = sum(ms for _, ms in rows)
    matrix = sum(ms for key, ms in rows if key in MATRIX_OPS)
    print(
        f"torch profile of one decode (profiler overhead included): {total:.3f} ms of operator "
        f"self time per token, matrix ops {matrix:.3f} ms ({matrix / total:.0%}); top operators:"
    )
    for key, ms in rows[:8]:
        print(f"  {key:40} {ms:7.3f} ms/token")
    batched_curve(target, prompts, args.batches, n)
    return 0


def llama_setup(
    args: argparse.Namespace,
    target: Path,
    prompts: list[list[int]],
    ref: list[list[int]],
    runners: dict[str, Callable[[], Rate]],
) -> str:
    """Export GGUF, check greedy identity, add llama.cpp's runners; returns a note."""
    if args.no_llama:
        return "skipped (--no-llama)"
    try:
        import gguf  # noqa: F401
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError as exc:
        return f"skipped: {exc} (pip install gguf llama-cpp-python)"
    out_dir = args.keep_gguf or Path(tempfile.mkdtemp(prefix="spectool-gguf-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    n = args.max_tokens
    notes = []
    for ftype in ("f16", "f32"):
        path = export_gguf(target, out_dir / f"demo-target-{ftype}.gguf", ftype)
        common = dict(
            model_path=str(path),
            n_ctx=args.prompt_tokens + n + args.k + 16,
            n_threads=args.threads,
            n_threads_batch=args.threads,
            n_batch=512,
            verbose=False,
        )
        llm = Llama(**common)
        outs, _ = llama_decode(llm, prompts, n)
        same = sum(a == b for a, b in zip(outs, ref, strict=True))
        notes.append(f"{ftype.upper()} greedy identical on {same}/{len(prompts)} prompts")
        runners[f"llama.cpp {ftype.upper()} greedy"] = lambda llm=llm: llama_decode(
            llm, prompts, n
        )[1]
        if ftype == "f16":
            lookup = Llama(
                **common,
                draft_model=LlamaPromptLookupDecoding(
                    max_ngram_size=args.ngram, num_pred_tokens=args.k
                ),
            )
            calls = count_calls(lookup)
            outs, (tokens, _) = llama_decode(lookup, prompts, n)
            same = sum(a == b for a, b in zip(outs, ref, strict=True))
            notes.append(
                f"F16 prompt lookup identical on {same}/{len(prompts)}, "
                f"{tokens / max(calls[0] - len(prompts), 1):.2f} tokens per "
                f"forward after the prefill"
            )
            runners["llama.cpp F16 prompt lookup"] = lambda lookup=lookup: llama_decode(
                lookup, prompts, n
            )[1]
    return "; ".join(notes)


if __name__ == "__main__":
    raise SystemExit(main())
