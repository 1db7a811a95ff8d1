"""Measure ``spectool:demo-target-mtp`` and write its model card (``scripts/train_mtp.py`` calls
this after training; ``python scripts/train_mtp.py --eval-only`` re-measures).

Every figure goes through the embedded engine on the assembled checkpoint (what
``spectool:demo-target-mtp`` resolves to): export parity against the training code, greedy
acceptance per draft position beside demo-eagle3's and demo-drafter's on the same held-out
prompts, and the cost of one draft step, the three methods' runs alternating.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from torch import Tensor
from train_mtp import OUT_DIR, PROJECTIONS, TARGET_DIR, TrainMtp

MODELS = OUT_DIR.parent
HEAD_DIR = MODELS / "demo-eagle3"
DRAFTER_DIR = MODELS / "demo-drafter"
K = 4


def assembled() -> Path:
    from spectool.ckpt.refs import builtin_path

    return builtin_path("demo-target-mtp")


def parity(folder: Path, heldout: Tensor) -> float:
    """Largest |difference| of logits between the training code's forward (the assembled full
    tensors loaded into it) and the engine's :class:`MtpModule` on one held-out window."""
    from safetensors.torch import load_file

    from spectool.engine.load import load_model
    from spectool.engine.model import make_step, rope_tables
    from spectool.engine.mtp_module import load_mtp_module

    target = load_model(TARGET_DIR, max_seq_len=128, pack_fp16=False).eval()
    n = target.args.n_layers
    module = load_mtp_module(
        folder, target.args, target.output, torch.device("cpu"), torch.float32, 128
    )
    cfg = json.loads((folder / "config.json").read_text())
    full = load_file(str(folder / "model-00002-of-00002.safetensors"))
    p = f"model.layers.{n}."
    base = {name: full[p + name + ".weight"].float() for name in PROJECTIONS}
    base |= {
        k: full[p + k + ".weight"].float() for k in ("input_layernorm", "post_attention_layernorm")
    }
    base["norm"] = full[p + "shared_head.norm.weight"].float()
    ref = TrainMtp(cfg, base, rank=1, seed=0)
    ref.enorm.data = full[p + "enorm.weight"].float()
    ref.hnorm.data = full[p + "hnorm.weight"].float()
    ref.eh_proj.data = full[p + "eh_proj.weight"].float()
    window = heldout[1000:1065][None]
    seq = window.shape[1] - 1
    with torch.inference_mode():
        positions = torch.arange(window.shape[1])[None]
        _, feats = target(window, positions, hidden_layers=(n - 1,))
        hidden = target.norm(feats)[:, :seq]
        embeds = target.tok_embeddings.weight[window[:, 1:]]
        cos, sin = rope_tables(target.args, 128)
        mask = torch.ones(seq, seq, dtype=torch.bool).tril()
        out, _ = ref.step(embeds, hidden, (cos[:seq], sin[:seq]), [], mask)
        ours = out[0] @ target.output.weight
        assert module.rope_cos_sin is not None
        step = make_step(
            module.args, module.rope_cos_sin, positions[:, :seq], None, None, target.output.weight
        )
        theirs = module.logits(module.forward(embeds[0], hidden[0], step), 4096)
    return float((ours - theirs).abs().max())


def acceptance(folder: Path, heldout: Tensor, args: argparse.Namespace) -> dict[str, object]:
    """Greedy, k = 4, through the engine: per-position acceptance of the MTP module, the EAGLE-3
    head and the draft model on ``--accept-prompts`` held-out prompts of 128 tokens, 64 new
    tokens each; and whether every output equals plain decoding."""
    from train_eagle3 import eval_windows

    from spectool.engine.engine import Engine, EngineConfig, SamplingParams

    prompts = eval_windows(heldout, args.accept_prompts, 128).tolist()
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    result: dict[str, object] = {"prompts": len(prompts), "prompt_len": 128, "new_tokens": 64}
    batch = len(prompts)
    baseline = Engine(TARGET_DIR, config=EngineConfig(method="none", max_batch_size=batch))
    want = baseline.generate(prompts, params)
    lossless = True
    for name, method, target, drafter in (
        ("mtp", "mtp", folder, None),
        ("eagle3", "eagle3", TARGET_DIR, HEAD_DIR),
        ("drafter", "draft_model", TARGET_DIR, DRAFTER_DIR),
    ):
        config = EngineConfig(method=method, max_draft_len=K, max_batch_size=batch)
        engine = Engine(target, drafter, config)
        lossless = lossless and engine.generate(prompts, params) == want
        stats = engine.drain_stats()
        accepted = [sum(s.accepted_per_pos[i] for s in stats) for i in range(K)]
        steps = sum(s.num_requests_with_draft_tokens for s in stats)
        result[name] = {
            "p_accepted_at_least": [a / steps for a in accepted],
            "conditional": [
                accepted[i] / (accepted[i - 1] if i else steps)
                if (accepted[i - 1] if i else steps)
                else 0.0
                for i in range(K)
            ],
            "mean_accepted_per_verify": sum(accepted) / steps,
            "verify_steps": steps,
        }
        print(name, result[name], flush=True)
    result["lossless"] = lossless
    return result


def draft_cost(folder: Path, args: argparse.Namespace) -> dict[str, object]:
    """One draft step's cost: batch 1, k = 4, greedy, 48 new tokens on ``--cost-rounds``
    built-in prompts; per run the median over iterations of draft ms / drafted tokens; the
    three methods' runs in rotating order (paired per prompt)."""
    from spectool.engine.engine import Engine, EngineConfig, SamplingParams
    from spectool.measure.workloads import builtin_workload

    torch.set_num_threads(args.threads)
    engines = {
        "mtp": Engine(folder, config=EngineConfig(method="mtp", max_draft_len=K)),
        "eagle3": Engine(TARGET_DIR, HEAD_DIR, EngineConfig(method="eagle3", max_draft_len=K)),
        "drafter": Engine(
            TARGET_DIR, DRAFTER_DIR, EngineConfig(method="draft_model", max_draft_len=K)
        ),
    }
    tok = engines["mtp"].tokenizer
    prompts = [tok.encode(p.text)[:128] for p in builtin_workload(args.cost_rounds, seed=1)]
    per_run: dict[str, list[float]] = {n: [] for n in engines}
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    names = list(engines)
    for r, prompt in enumerate(prompts):
        for name in names[r % 3 :] + names[: r % 3]:
            engines[name].drain_stats()
            engines[name].generate([prompt], params)
            stats = [s for s in engines[name].drain_stats() if s.num_draft_tokens]
            per_run[name].append(statistics.median(s.draft_ms / s.num_draft_tokens for s in stats))

    def summary(values: list[float]) -> list[float]:
        return [statistics.median(values), min(values), max(values)]

    out: dict[str, object] = {"runs": len(prompts), "threads": args.threads}
    for name, runs in per_run.items():
        out[f"{name}_ms"] = summary(runs)
    for other in ("eagle3", "drafter"):
        ratios = [a / b for a, b in zip(per_run["mtp"], per_run[other], strict=True)]
        out[f"mtp_over_{other}"] = summary(ratios)
    return out


def evaluate(args: argparse.Namespace, train_facts: dict) -> dict:
    from train_eagle3 import streams

    torch.set_num_threads(args.threads)
    _, heldout, _ = streams()
    folder = assembled()
    facts = {
        "train": train_facts,
        "shipped_bytes": (OUT_DIR / "mtp.safetensors").stat().st_size,
        "module_bytes": (folder / "model-00002-of-00002.safetensors").stat().st_size,
        "parity_max_abs": parity(folder, heldout),
        "acceptance": acceptance(folder, heldout, args),
        "draft_cost": draft_cost(folder, args),
    }
    print(json.dumps({k: v for k, v in facts.items() if k != "train"}, indent=1), flush=True)
    return facts


def _row(name: str, values: list[float]) -> str:
    return f"| {name} | " + " | ".join(f"{v:.3f}" for v in values) + " |"


def _ms(values: list[float]) -> str:
    return f"{values[0]:.3f} ({values[1]:.3f}-{values[2]:.3f})"


def render_card(facts: dict) -> str:
    tr, acc, cost = facts["train"], facts["acceptance"], facts["draft_cost"]
    m, e3, dr = acc["mtp"], acc["eagle3"], acc["drafter"]
    last = tr["log"][-1]["loss_per_ttt_step"]
    first = tr["log"][0]["loss_per_ttt_step"]
    return f"""# `demo-target-mtp`: demo-target with one native MTP module

`demo-target` plus one multi-token-prediction (MTP) module in DeepSeek-V3's layout, trained on
the frozen target, so that spectool's embedded engine, `check`, `build` and `serve` have a real
target with native MTP layers offline. Made and measured by `scripts/train_mtp.py` (seed
{tr["seed"]}) and `scripts/measure_mtp.py`; every number below was measured by them.

Reproduce: `python scripts/train_mtp.py --steps {tr["steps"]}` (Python {tr["python"]}, torch
{tr["torch"]}, {tr["threads"]} threads). `--eval-only` re-measures and rewrites this card.

## Layout

As deepseek-ai/DeepSeek-V3 `README_WEIGHTS.md` (commit 0b39205a) describes it:
`config.json` is demo-target's with `num_nextn_predict_layers: 1`; the module is stored as
decoder layer `num_hidden_layers` = 12: `model.layers.12.enorm`, `.hnorm`, `.eh_proj`
([256, 512]: [embedding, hidden]), a decoder layer shaped like the target's
(`input_layernorm`, `self_attn.{{q,k,v,o}}_proj`, `post_attention_layernorm`,
`mlp.{{gate,up,down}}_proj`), `shared_head.norm`, and copies of the target's embedding and
LM head as `embed_tokens` and `shared_head.head` (DeepSeek-V3 stores those copies too).

Computation (NVIDIA/TensorRT-LLM `tensorrt_llm/_torch/models/modeling_deepseekv3.py` commit
000561df, `DeepseekV3MTP`; vLLM `vllm/model_executor/models/deepseek_mtp.py` commit 03356f8c):
at position p the module reads the target's final-normed hidden state H_p and the embedding of
token p + 1: `eh_proj(cat([enorm(embed), hnorm(H_p)]))`, the decoder layer, `shared_head.norm`;
the target's LM head gives token p + 2. For k > 1 the engine re-applies the module to its own
output (TensorRT-LLM's MTP-Eagle, `tensorrt_llm/_torch/speculative/mtp.py` commit 000a01de).
vLLM differs in two details, and spectool follows TensorRT-LLM: vLLM zeroes the embedding at
position 0, and chains the pre-norm output where TensorRT-LLM chains the normed one.

**What ships.** The folder `spectool/assets/models/demo-target-mtp/` holds config.json, this
card, `mtp_training.json` and `mtp.safetensors` ({facts["shipped_bytes"] / 1e3:.0f} kB): the
module's norms and `eh_proj`, and its decoder layer as rank-{tr["rank"]} updates `B @ A` of
demo-target's layer {tr["base_layer"]} (the layer it was trained from), in float16. A full copy
would not fit under the 25 MB cap on shipped models (demo-target alone is 20 MB). On first use
spectool writes the real checkpoint into its cache (`spectool/builtin_models.py`): demo-target's
weights as `model-00001-of-00002.safetensors`, the module with every tensor in full as
`model-00002-of-00002.safetensors` ({facts["module_bytes"] / 1e6:.2f} MB), an index, and the
tokenizer files; `spectool:demo-target-mtp` names that folder.

## Training

- Data: the demo corpus (CPython {tr["python"]} standard library, the demo pair's split:
  {tr["corpus"]["train_files"]} training files, {tr["corpus"]["train_tokens"]:,} tokens;
  {tr["corpus"]["heldout_files"]} held-out files), random windows of {tr["seq_len"]} tokens,
  {tr["batch"]} per step, {tr["steps"]} steps.
- Frozen: the target, its embedding and LM head. Trained: `enorm`, `hnorm`, `eh_proj` (from
  `[N(0, 0.02) | I]`), the layer's two norms and `shared_head.norm` (from the target's), and
  rank-{tr["rank"]} updates of the layer's seven projections (from the target's last layer).
- Objective: soft cross-entropy to the target's next-token distribution, over a training-time
  test of {tr["ttt_steps"]} chain steps weighted 0.8^s (step s >= 1 reads the module's own
  output, as MTP-Eagle does; tokens teacher-forced), as `scripts/train_eagle3.py` trains
  demo-eagle3.
- AdamW (0.9/0.95), peak LR {tr["lr"]}, {tr["warmup"]} warm-up steps, cosine to 0.1 x, clip 1.0.
- Wall time: {tr["train_s"]:.0f} s of training ({tr["train_s"] / 60:.1f} min) on {tr["threads"]}
  threads of a shared 2-core machine (other jobs running), plus {tr["encode_s"]:.0f} s reading
  and tokenizing the corpus.
- Losses per chain step (nats): first step {", ".join(f"{x:.3f}" for x in first)}; last logged
  {", ".join(f"{x:.3f}" for x in last)}.
- Export check: the engine's module and the training code agree on held-out logits to
  {facts["parity_max_abs"]:.1e}.

## Acceptance on held-out text (greedy, k = 4, through the embedded engine)

{acc["prompts"]} held-out prompts of {acc["prompt_len"]} tokens, {acc["new_tokens"]} new tokens
each, every verify step counted, the same prompts for all three drafters; every output
identical to plain decoding: {acc["lossless"]}.

| P(accepted >= position) | 1 | 2 | 3 | 4 |
|---|---|---|---|---|
{_row("demo-target-mtp (MTP)", m["p_accepted_at_least"])}
{_row("demo-eagle3", e3["p_accepted_at_least"])}
{_row("demo-drafter", dr["p_accepted_at_least"])}

| P(accepted at position given the one before) | 1 | 2 | 3 | 4 |
|---|---|---|---|---|
{_row("demo-target-mtp (MTP)", m["conditional"])}
{_row("demo-eagle3", e3["conditional"])}
{_row("demo-drafter", dr["conditional"])}

Mean accepted drafts per verify step: MTP {m["mean_accepted_per_verify"]:.2f}, demo-eagle3
{e3["mean_accepted_per_verify"]:.2f}, demo-drafter {dr["mean_accepted_per_verify"]:.2f}.

## Cost per draft step (embedded engine, CPU, batch 1, float32)

Draft-phase milliseconds per drafted token (k = 4, 48 new tokens), the three methods' runs in
rotating order on the same {cost["runs"]} prompts ({cost["threads"]} threads): median (min-max)
over runs. Measured on a shared 2-core machine with other jobs running: the ranges are mostly
their load; the per-prompt ratios are fairer than either figure.

| | ms per draft step |
|---|---|
| MTP module | {_ms(cost["mtp_ms"])} |
| demo-eagle3 | {_ms(cost["eagle3_ms"])} |
| demo-drafter | {_ms(cost["drafter_ms"])} |
| MTP / demo-eagle3, per prompt | {_ms(cost["mtp_over_eagle3"])} |
| MTP / demo-drafter, per prompt | {_ms(cost["mtp_over_drafter"])} |

An MTP step is one decoder layer of the target's width plus the target's LM head, as an EAGLE-3
step is (its LM head covers 1024 draft tokens, the MTP module's all 4096); the draft model runs
one layer of half the width.

## License

Trained on CPython standard-library source (PSF License); released with spectool.
"""
