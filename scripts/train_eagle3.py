"""Train ``spectool:demo-eagle3``: a tiny EAGLE-3 head for ``demo-target``, and measure it.

What is trained (EAGLE-3, Li et al. 2025, as laid out by SafeAILab/EAGLE ``eagle/model/cnets.py``):
``fc`` fuses the target's hidden states after decoder layers (1, 5, 8) (TensorRT-LLM's default
``(1, L // 2 - 1, L - 4)`` for L = 12), one Llama decoder layer reads
``cat(input_layernorm(embedding of the next token), hidden_norm(fused))``, then ``norm`` and
``lm_head`` over a draft vocabulary of the ``--draft-vocab`` most frequent target tokens of the
training stream (``d2t``: draft id -> target id offset; ``t2d``: mask over target ids). The token
embedding is the target's (not stored in the head, as in the published heads).

Data: the demo models' corpus (``scripts/train_demo.py``: CPython standard-library source, the same
held-out files), tokenized with demo-target's tokenizer; random windows of ``--seq-len`` tokens.
The target (float32, frozen) gives the features and the soft labels of every window on the fly.

Objective: soft cross-entropy against the target's next-token distribution restricted to the draft
vocabulary (EAGLE-3's token-level loss), summed over a training-time test of ``--ttt-steps`` steps
with weights 0.8^s. Step 0 is teacher-forced on target features; step s >= 1 feeds the head's own
step s-1 output (at the position before) with the true next token, and its attention sees what the
engine's chain sees: step-0 keys up to the anchor position (p - s), and the key of every earlier
step at its own chain position (p - s + j). A simplification of the paper's test: tokens are
teacher-forced (the true ones, not the head's drafts).

Usage::

    python scripts/train_eagle3.py                  # train, save, measure, write the card
    python scripts/train_eagle3.py --eval-only      # re-measure the shipped head, rewrite the card
    python scripts/train_eagle3.py --bench          # engine: eagle3 vs draft_model vs baseline

Outputs ``spectool/assets/models/demo-eagle3/`` (config.json, model.safetensors in float16, d2t
int64, t2d bool, README.md) and ``eagle3_training.json`` beside the card.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "scripts"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from spectool.io import atomic_write_text  # noqa: E402

MODELS = REPO_ROOT / "spectool" / "assets" / "models"
TARGET_DIR = MODELS / "demo-target"
DRAFTER_DIR = MODELS / "demo-drafter"
HEAD_DIR = MODELS / "demo-eagle3"
FACTS_FILE = HEAD_DIR / "eagle3_training.json"


# -- data ---------------------------------------------------------------------------------------


def streams() -> tuple[Tensor, Tensor, dict[str, object]]:
    """(train, held-out) token streams of the demo corpus, tokenized by demo-target's tokenizer."""
    import train_demo
    from tokenizers import Tokenizer

    files = train_demo.stdlib_files(train_demo.stdlib_root())
    train_files, heldout_files = train_demo.split_files(files)
    tok = Tokenizer.from_file(str(TARGET_DIR / "tokenizer.json"))
    train = train_demo.encode_stream(tok, train_demo.read_sources(train_files))
    heldout = train_demo.encode_stream(tok, train_demo.read_sources(heldout_files))
    corpus = {
        "train_files": len(train_files),
        "heldout_files": len(heldout_files),
        "train_tokens": int(train.numel()),
        "heldout_tokens": int(heldout.numel()),
    }
    return train, heldout, corpus


def eval_windows(stream: Tensor, n: int, length: int) -> Tensor:
    """``n`` evenly spaced windows of ``length`` tokens."""
    last = stream.numel() - length
    starts = torch.linspace(0, last, n).long().tolist()
    return torch.stack([stream[s : s + length] for s in starts])


# -- the head, trainable -------------------------------------------------------------------------


class TrainHead(nn.Module):
    """The EAGLE-3 head in Hugging Face's tensor layout, with the training-time-test attention."""

    def __init__(self, cfg: dict, n_capture: int, draft_vocab: int) -> None:
        super().__init__()
        dim, inter = cfg["hidden_size"], cfg["intermediate_size"]
        self.heads, self.kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg["head_dim"]
        self.eps = cfg["rms_norm_eps"]
        self.fc = nn.Linear(n_capture * dim, dim, bias=False)
        self.q_proj = nn.Linear(2 * dim, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * dim, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * dim, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, dim, bias=False)
        self.gate_proj = nn.Linear(dim, inter, bias=False)
        self.up_proj = nn.Linear(dim, inter, bias=False)
        self.down_proj = nn.Linear(inter, dim, bias=False)
        self.hidden_norm = nn.Parameter(torch.ones(dim))
        self.input_layernorm = nn.Parameter(torch.ones(dim))
        self.post_attention_layernorm = nn.Parameter(torch.ones(dim))
        self.norm = nn.Parameter(torch.ones(dim))
        self.lm_head = nn.Linear(dim, draft_vocab, bias=False)

    def rms(self, x: Tensor, w: Tensor) -> Tensor:
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:  # x [B, H, T, D]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def step(
        self,
        embeds: Tensor,  # [B, T, dim]
        hidden: Tensor,  # [B, T, dim] (fused)
        cos: Tensor,
        sin: Tensor,  # [T, D]
        past: list[tuple[Tensor, Tensor]],  # keys/values of earlier steps [B, Hkv, T, D]
        mask: Tensor,  # [T, (len(past) + 1) * T] bool, True = visible
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        bsz, seq, _ = embeds.shape
        x = torch.cat(
            [self.rms(embeds, self.input_layernorm), self.rms(hidden, self.hidden_norm)], -1
        )
        q = self.q_proj(x).view(bsz, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(bsz, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(bsz, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        keys = torch.cat([p[0] for p in past] + [k], dim=2)
        values = torch.cat([p[1] for p in past] + [v], dim=2)
        groups = self.heads // self.kv_heads
        keys = keys.repeat_interleave(groups, dim=1)
        values = values.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        h = hidden + self.o_proj(y.transpose(1, 2).reshape(bsz, seq, -1))
        g = self.rms(h, self.post_attention_layernorm)
        out = h + self.down_proj(F.silu(self.gate_proj(g)) * self.up_proj(g))
        return out, (k, v)

    def logits(self, out: Tensor) -> Tensor:
        return self.lm_head(self.rms(out, self.norm))


def ttt_masks(seq: int, steps: int) -> list[Tensor]:
    """Step s's attention mask over [step-0 keys, ..., step-s keys] (see the module docstring)."""
    p = torch.arange(seq)[:, None]
    key = torch.arange(seq)[None, :]
    masks = []
    for s in range(steps):
        blocks = [key <= p - s]
        blocks += [key == p - s + j for j in range(1, s + 1)]
        mask = torch.cat(blocks, dim=1)
        mask[:, 0] |= ~mask.any(dim=1)  # rows p < s see nothing valid: never NaN, never scored
        masks.append(mask)
    return masks


def ttt_loss(
    head: TrainHead,
    embed: Tensor,  # [V, dim] the target's
    window: Tensor,  # [B, T] tokens
    feats: Tensor,  # [B, T, 3 dim] target features
    target_logp: Tensor,  # [B, T, Vd] log-probabilities of the target over the draft vocab
    rope: tuple[Tensor, Tensor],
    masks: list[Tensor],
) -> tuple[Tensor, list[float]]:
    """Training-time-test loss: step s predicts token p + 2 at position p for p >= s."""
    seq = window.shape[1] - 1  # positions 0..T-2 have a next token (p + 1) and a label (p + 2)
    cos, sin = rope
    embeds = embed[window[:, 1:]]  # token p + 1 at position p
    hidden = head.fc(feats[:, :seq])
    labels = target_logp[:, 1:].exp()  # the target's distribution of token p + 2
    past: list[tuple[Tensor, Tensor]] = []
    total = embeds.new_zeros(())
    per_step = []
    for s, mask in enumerate(masks):
        out, kv = head.step(embeds, hidden, cos[:seq], sin[:seq], past, mask[:seq, : (s + 1) * seq])
        past.append(kv)
        logp = F.log_softmax(head.logits(out[:, s:]).float(), dim=-1)
        loss = -(labels[:, s:] * logp).sum(-1).mean()
        total = total + (0.8**s) * loss
        per_step.append(float(loss.detach()))
        # Next step at position p reads this step's output at p - 1 (padded at 0, never scored).
        hidden = torch.cat([out[:, :1], out[:, :-1]], dim=1)
    return total, per_step


# -- training ------------------------------------------------------------------------------------


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(args: argparse.Namespace) -> dict[str, object]:
    from spectool.engine.eagle3_head import default_capture_layers
    from spectool.engine.load import load_model
    from spectool.engine.model import rope_tables

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    train_stream, heldout, corpus = streams()
    encode_s = time.perf_counter() - t0
    target = load_model(TARGET_DIR, max_seq_len=args.seq_len, pack_fp16=False).eval()
    targs = target.args
    layers = default_capture_layers(targs.n_layers)
    counts = torch.bincount(train_stream, minlength=targs.vocab_size)
    keep = torch.sort(torch.topk(counts, args.draft_vocab).indices).values  # draft id -> target id
    coverage = float(counts[keep].sum() / counts.sum())
    cfg = {
        "hidden_size": targs.dim,
        "intermediate_size": args.intermediate,
        "num_attention_heads": targs.n_heads,
        "num_key_value_heads": targs.n_kv_heads,
        "head_dim": targs.head_dim,
        "rms_norm_eps": targs.norm_eps,
    }
    head = TrainHead(cfg, len(layers), args.draft_vocab)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        # Start the draft head from the target's LM head rows: both map normed features to tokens.
        head.lm_head.weight.copy_(target.output.weight.t()[keep])
    embed = target.tok_embeddings.weight.detach()
    args_rope = targs
    cos, sin = rope_tables(args_rope, args.seq_len)
    masks = ttt_masks(args.seq_len - 1, args.ttt_steps)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    log: list[dict[str, object]] = []
    t_train = time.perf_counter()
    for step in range(args.steps):
        starts = torch.randint(0, train_stream.numel() - args.seq_len, (args.batch,), generator=gen)
        window = torch.stack([train_stream[s : s + args.seq_len] for s in starts.tolist()])
        with torch.no_grad():
            positions = torch.arange(args.seq_len).expand(args.batch, -1)
            logits, feats = target(window, positions, hidden_layers=layers)
            target_logp = F.log_softmax(logits[..., keep].float(), dim=-1)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        loss, per_step = ttt_loss(head, embed, window, feats, target_logp, (cos, sin), masks)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            elapsed = time.perf_counter() - t_train
            log.append({"step": step, "loss_per_ttt_step": per_step, "s": round(elapsed, 1)})
            print(f"step {step} loss {[round(x, 3) for x in per_step]} {elapsed:.0f}s", flush=True)
    train_s = time.perf_counter() - t_train
    save_head(head, cfg, layers, keep, targs)
    return {
        "seed": args.seed,
        "threads": args.threads,
        "steps": args.steps,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "lr": args.lr,
        "warmup": args.warmup,
        "ttt_steps": args.ttt_steps,
        "draft_vocab": args.draft_vocab,
        "draft_vocab_coverage": coverage,
        "intermediate_size": args.intermediate,
        "capture_layers": list(layers),
        "corpus": corpus,
        "encode_s": round(encode_s, 1),
        "train_s": round(train_s, 1),
        "log": log,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }


def save_head(head: TrainHead, cfg: dict, layers: tuple[int, ...], keep: Tensor, targs) -> None:
    """The published layout: float16 weights, int64 ``d2t``, bool ``t2d``."""
    from safetensors.torch import save_file

    from spectool.io import atomic_write_bytes

    draft_vocab = keep.numel()
    tensors = {
        "fc.weight": head.fc.weight,
        "midlayer.self_attn.q_proj.weight": head.q_proj.weight,
        "midlayer.self_attn.k_proj.weight": head.k_proj.weight,
        "midlayer.self_attn.v_proj.weight": head.v_proj.weight,
        "midlayer.self_attn.o_proj.weight": head.o_proj.weight,
        "midlayer.mlp.gate_proj.weight": head.gate_proj.weight,
        "midlayer.mlp.up_proj.weight": head.up_proj.weight,
        "midlayer.mlp.down_proj.weight": head.down_proj.weight,
        "midlayer.hidden_norm.weight": head.hidden_norm,
        "midlayer.input_layernorm.weight": head.input_layernorm,
        "midlayer.post_attention_layernorm.weight": head.post_attention_layernorm,
        "norm.weight": head.norm,
        "lm_head.weight": head.lm_head.weight,
    }
    out = {k: v.detach().to(torch.float16).contiguous() for k, v in tensors.items()}
    out["d2t"] = (keep - torch.arange(draft_vocab)).to(torch.int64)
    t2d = torch.zeros(targs.vocab_size, dtype=torch.bool)
    t2d[keep] = True
    out["t2d"] = t2d
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "head_dim": cfg["head_dim"],
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_theta": targs.rope_theta,
        "max_position_embeddings": targs.max_position_embeddings,
        "vocab_size": targs.vocab_size,
        "draft_vocab_size": draft_vocab,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 1,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layers)},
    }
    HEAD_DIR.mkdir(parents=True, exist_ok=True)
    tmp = HEAD_DIR / "model.safetensors.tmp"
    save_file(out, str(tmp))
    atomic_write_bytes(HEAD_DIR / "model.safetensors", tmp.read_bytes())
    tmp.unlink()
    atomic_write_text(HEAD_DIR / "config.json", json.dumps(config, indent=2) + "\n")


# -- measurements --------------------------------------------------------------------------------


def parity(heldout: Tensor) -> float:
    """Largest |difference| of step-0 logits between this script's head (float16 weights read
    back) and the engine's :class:`Eagle3Head` on one held-out window: the export is exact."""
    from safetensors.torch import load_file

    from spectool.engine.eagle3_head import load_eagle3_head
    from spectool.engine.load import load_model
    from spectool.engine.model import make_step, rope_tables

    target = load_model(TARGET_DIR, max_seq_len=128, pack_fp16=False).eval()
    engine_head, layers = load_eagle3_head(
        HEAD_DIR, target.args, torch.device("cpu"), torch.float32, 128
    )
    cfg = json.loads((HEAD_DIR / "config.json").read_text())
    raw = load_file(str(HEAD_DIR / "model.safetensors"))
    head = TrainHead(cfg, len(layers), cfg["draft_vocab_size"])
    for ours, name in (
        ("fc", "fc.weight"),
        ("q_proj", "midlayer.self_attn.q_proj.weight"),
        ("k_proj", "midlayer.self_attn.k_proj.weight"),
        ("v_proj", "midlayer.self_attn.v_proj.weight"),
        ("o_proj", "midlayer.self_attn.o_proj.weight"),
        ("gate_proj", "midlayer.mlp.gate_proj.weight"),
        ("up_proj", "midlayer.mlp.up_proj.weight"),
        ("down_proj", "midlayer.mlp.down_proj.weight"),
        ("lm_head", "lm_head.weight"),
    ):
        getattr(head, ours).weight.data = raw[name].float()
    for ours, name in (
        ("hidden_norm", "midlayer.hidden_norm.weight"),
        ("input_layernorm", "midlayer.input_layernorm.weight"),
        ("post_attention_layernorm", "midlayer.post_attention_layernorm.weight"),
        ("norm", "norm.weight"),
    ):
        getattr(head, ours).data = raw[name].float()
    window = heldout[1000:1065][None]
    seq = window.shape[1] - 1
    with torch.inference_mode():
        positions = torch.arange(window.shape[1])[None]
        _, feats = target(window, positions, hidden_layers=layers)
        cos, sin = rope_tables(target.args, 128)
        mask = ttt_masks(seq, 1)[0]
        out, _ = head.step(
            target.tok_embeddings.weight[window[:, 1:]],
            head.fc(feats[:, :seq]),
            cos[:seq],
            sin[:seq],
            [],
            mask,
        )
        ours = head.logits(out)[0]
        assert engine_head.rope_cos_sin is not None
        step = make_step(
            engine_head.args,
            engine_head.rope_cos_sin,
            positions[:, :seq],
            None,
            None,
            engine_head.lm_head.weight,
        )
        emb = target.tok_embeddings.weight[window[0, 1:]]
        theirs = engine_head.logits(engine_head.forward(emb, feats[0, :seq], step), 4096)
        theirs = theirs[:, engine_head.draft_to_target]
    return float((ours - theirs).abs().max())


def acceptance(heldout: Tensor, args: argparse.Namespace) -> dict[str, object]:
    """Greedy, k = 4, through the engine: per-position acceptance of the head and of the
    demo-drafter on ``--accept-prompts`` held-out prompts of 128 tokens, 64 new tokens each."""
    from spectool.engine.engine import Engine, EngineConfig, SamplingParams

    prompts = eval_windows(heldout, args.accept_prompts, 128).tolist()
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    result: dict[str, object] = {"prompts": len(prompts), "prompt_len": 128, "new_tokens": 64}
    outputs = {}
    for name, method, folder in (
        ("eagle3", "eagle3", HEAD_DIR),
        ("drafter", "draft_model", DRAFTER_DIR),
    ):
        engine = Engine(
            TARGET_DIR,
            folder,
            EngineConfig(method=method, max_draft_len=4, max_batch_size=len(prompts)),
        )
        outputs[name] = engine.generate(prompts, params)
        stats = engine.drain_stats()
        drafted = [sum(s.drafted_per_pos[i] for s in stats) for i in range(4)]
        accepted = [sum(s.accepted_per_pos[i] for s in stats) for i in range(4)]
        steps = sum(s.num_requests_with_draft_tokens for s in stats)
        result[name] = {
            "p_accepted_at_least": [a / steps for a in accepted],
            "conditional": [
                accepted[i] / (accepted[i - 1] if i else steps)
                if (accepted[i - 1] if i else steps)
                else 0.0
                for i in range(4)
            ],
            "mean_accepted_per_verify": sum(accepted) / steps,
            "drafted_per_pos": drafted,
            "verify_steps": steps,
        }
    baseline = Engine(
        TARGET_DIR, config=EngineConfig(method="none", max_batch_size=len(prompts))
    ).generate(prompts, params)
    result["lossless"] = outputs["eagle3"] == baseline and outputs["drafter"] == baseline
    return result


def _run(engine, prompts: list[list[int]], max_tokens: int) -> tuple[float, int, int, float]:
    """(wall s, output tokens, verify rows, draft ms per drafted token) of one greedy run."""
    from spectool.engine.engine import SamplingParams

    engine.drain_stats()
    t = time.perf_counter()
    out = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    wall = time.perf_counter() - t
    stats = engine.drain_stats()
    rows = sum(s.num_decoded_requests for s in stats)
    drafted = sum(s.num_draft_tokens for s in stats)
    draft_ms = sum(s.draft_ms for s in stats) / drafted if drafted else 0.0
    return wall, sum(len(o) for o in out), rows, draft_ms


def bench(args: argparse.Namespace) -> dict[str, object]:
    """Engine only, greedy, built-in (tune's) prompts: baseline vs draft_model vs eagle3 at batch
    1 and 8, k = 1..4; arms interleaved round by round (order rotated), one engine per method
    switched with ``set_draft_len``. Reports tokens per verify (output tokens per decoded row,
    prefill token excluded) and ms per output token (medians over rounds, with min-max)."""
    from spectool.engine.engine import Engine, EngineConfig
    from spectool.measure.workloads import builtin_workload

    torch.set_num_threads(args.threads)
    engines = {
        "baseline": Engine(TARGET_DIR, config=EngineConfig(method="none", max_batch_size=8)),
        "draft_model": Engine(
            TARGET_DIR, DRAFTER_DIR, EngineConfig(method="draft_model", max_batch_size=8)
        ),
        "eagle3": Engine(TARGET_DIR, HEAD_DIR, EngineConfig(method="eagle3", max_batch_size=8)),
    }
    tok = engines["baseline"].tokenizer
    texts = [p.text for p in builtin_workload(16, seed=0)]
    prompts = [tok.encode(t)[:192] for t in texts]
    rows: list[dict[str, object]] = []
    for batch in (1, 8):
        for k in (1, 2, 3, 4):
            for name in ("draft_model", "eagle3"):
                engines[name].set_draft_len(k)
            samples: dict[str, list[tuple[float, int, int, float]]] = {n: [] for n in engines}
            arms = list(engines)
            for r in range(args.rounds):
                chosen = [prompts[(r * batch + i) % len(prompts)] for i in range(batch)]
                for name in arms[r % 3 :] + arms[: r % 3]:
                    samples[name].append(_run(engines[name], chosen, args.bench_tokens))
            for name, runs in samples.items():
                ms = [1e3 * w / n for w, n, _, _ in runs]
                per_verify = [(n - len(chosen)) / v for _, n, v, _ in runs]
                rows.append(
                    {
                        "batch": batch,
                        "k": 0 if name == "baseline" else k,
                        "method": name,
                        "tokens_per_verify": statistics.median(per_verify),
                        "ms_per_token": statistics.median(ms),
                        "ms_per_token_range": [min(ms), max(ms)],
                        "draft_ms_per_drafted_token": statistics.median(r[3] for r in runs),
                    }
                )
                print(rows[-1], flush=True)
    return {
        "rounds": args.rounds,
        "max_tokens": args.bench_tokens,
        "threads": args.threads,
        "rows": rows,
    }


def draft_cost(args: argparse.Namespace) -> dict[str, object]:
    """Cost of one draft step, head vs demo-drafter: batch 1, k = 4, greedy, the two engines'
    runs alternating (paired); per run the median of draft ms / drafted tokens per iteration."""
    from spectool.engine.engine import Engine, EngineConfig, SamplingParams
    from spectool.measure.workloads import builtin_workload

    torch.set_num_threads(args.threads)
    engines = {
        "eagle3": Engine(TARGET_DIR, HEAD_DIR, EngineConfig(method="eagle3", max_draft_len=4)),
        "drafter": Engine(
            TARGET_DIR, DRAFTER_DIR, EngineConfig(method="draft_model", max_draft_len=4)
        ),
    }
    tok = engines["eagle3"].tokenizer
    prompts = [tok.encode(p.text)[:128] for p in builtin_workload(args.cost_rounds, seed=1)]
    per_run: dict[str, list[float]] = {n: [] for n in engines}
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    for r, prompt in enumerate(prompts):
        order = list(engines) if r % 2 == 0 else list(engines)[::-1]
        for name in order:
            engines[name].drain_stats()
            engines[name].generate([prompt], params)
            stats = [s for s in engines[name].drain_stats() if s.num_draft_tokens]
            per_run[name].append(statistics.median(s.draft_ms / s.num_draft_tokens for s in stats))
    ratios = [a / b for a, b in zip(per_run["eagle3"], per_run["drafter"], strict=True)]
    return {
        "runs": len(prompts),
        "threads": args.threads,
        "eagle3_ms": [
            statistics.median(per_run["eagle3"]),
            min(per_run["eagle3"]),
            max(per_run["eagle3"]),
        ],
        "drafter_ms": [
            statistics.median(per_run["drafter"]),
            min(per_run["drafter"]),
            max(per_run["drafter"]),
        ],
        "ratio": [statistics.median(ratios), min(ratios), max(ratios)],
    }


# -- the card ------------------------------------------------------------------------------------


def render_card(facts: dict) -> str:
    tr, acc, cost = facts["train"], facts["acceptance"], facts["draft_cost"]
    size = (HEAD_DIR / "model.safetensors").stat().st_size
    e3, dr = acc["eagle3"], acc["drafter"]

    def row(name: str, values: list[float]) -> str:
        return f"| {name} | " + " | ".join(f"{v:.3f}" for v in values) + " |"

    last = tr["log"][-1]["loss_per_ttt_step"]
    return f"""# `demo-eagle3`: an EAGLE-3 head for `demo-target`

A tiny EAGLE-3 draft head trained on `demo-target`'s own hidden states, so that spectool's
embedded engine, `check` and the tests have a real EAGLE-3 checkpoint offline. Made and measured
by `scripts/train_eagle3.py` (seed {tr["seed"]}); every number below was measured by that script.

Reproduce: `python scripts/train_eagle3.py --steps {tr["steps"]}` (Python {tr["python"]},
torch {tr["torch"]}, {tr["threads"]} threads). `--eval-only` re-measures this folder and rewrites
this card.

## Layout (as the published heads, e.g. `yuhuili/EAGLE3-LLaMA3.1-Instruct-8B`)

`config.json`: `architectures: ["LlamaForCausalLMEagle3"]`, 1 decoder layer, hidden
{facts["shape"]["hidden_size"]} (the target's), intermediate {tr["intermediate_size"]}, 4 heads /
2 kv heads of 64, `draft_vocab_size` {tr["draft_vocab"]}, `eagle_config.
eagle_aux_hidden_state_layer_ids` {tr["capture_layers"]} (TensorRT-LLM's default
`(1, L // 2 - 1, L - 4)` for the 12-layer target). `model.safetensors` ({size / 1e6:.2f} MB):
`fc.weight` [256, 768], `midlayer.self_attn.{{q,k,v,o}}_proj.weight` (q/k/v read 2 x 256:
[embedding; fused hidden]), `midlayer.mlp.*`, `midlayer.{{hidden_norm,input_layernorm,
post_attention_layernorm}}.weight`, `norm.weight`, `lm_head.weight` [{tr["draft_vocab"]}, 256]
in float16; `d2t` int64 [{tr["draft_vocab"]}] (target id = draft id + d2t[draft id]) and `t2d`
bool [4096]. No `embed_tokens`: the head uses the target's embeddings.

## Training

- Data: the demo corpus (CPython {tr["python"]} standard library, the demo pair's split:
  {tr["corpus"]["train_files"]} training files, {tr["corpus"]["train_tokens"]:,} tokens;
  {tr["corpus"]["heldout_files"]} held-out files, {tr["corpus"]["heldout_tokens"]:,} tokens), random
  windows of {tr["seq_len"]} tokens, {tr["batch"]} per step, {tr["steps"]} steps.
- Draft vocabulary: the {tr["draft_vocab"]} most frequent target tokens of the training stream
  ({100 * tr["draft_vocab_coverage"]:.1f} % of its tokens).
- Features and labels: the float32 target run on each window (layers {tr["capture_layers"]}
  captured after the layer; its next-token distribution restricted to the draft vocabulary).
- Objective: soft cross-entropy to the target, over a training-time test of {tr["ttt_steps"]}
  steps weighted 0.8^s: step 0 on target features, step s >= 1 on the head's own previous
  output, attending as the engine's chain does (target-feature keys up to the anchor, then the
  chain's own keys). Simplification: the chain's tokens are the true ones (teacher forcing).
- AdamW (0.9/0.95), peak LR {tr["lr"]}, {tr["warmup"]} warm-up steps, cosine to 0.1 x, clip 1.0;
  `lm_head` starts from the target's LM head rows of the draft vocabulary.
- Wall time: {tr["train_s"]:.0f} s of training ({tr["train_s"] / 60:.1f} min) on {tr["threads"]}
  threads of a shared 2-core machine (other jobs running: the figure moves with their load),
  plus {tr["encode_s"]:.0f} s reading and tokenizing the corpus.
- Last logged losses per test step (nats): {", ".join(f"{x:.3f}" for x in last)}.
- Export check: the engine's head and this script's agree on held-out logits to
  {facts["parity_max_abs"]:.1e}.

## Acceptance on held-out text (greedy, k = 4, through the embedded engine)

{acc["prompts"]} held-out prompts of {acc["prompt_len"]} tokens, {acc["new_tokens"]} new tokens
each, every verify step counted; output identical to plain decoding: {acc["lossless"]}.

| P(accepted >= position) | 1 | 2 | 3 | 4 |
|---|---|---|---|---|
{row("demo-eagle3", e3["p_accepted_at_least"])}
{row("demo-drafter", dr["p_accepted_at_least"])}

| P(accepted at position given the one before) | 1 | 2 | 3 | 4 |
|---|---|---|---|---|
{row("demo-eagle3", e3["conditional"])}
{row("demo-drafter", dr["conditional"])}

Mean accepted drafts per verify step: demo-eagle3 {e3["mean_accepted_per_verify"]:.2f},
demo-drafter {dr["mean_accepted_per_verify"]:.2f}.

## Cost per draft step (embedded engine, CPU, batch 1, float32)

Draft-phase milliseconds per drafted token (k = 4, 48 new tokens), the head's and the
demo-drafter's runs alternating on the same {cost["runs"]} prompts ({cost["threads"]} threads):
median (min-max) over runs. Measured on a shared 2-core machine with other jobs running: the
ranges are mostly their load; the pairing keeps the ratio fairer than either figure.

| | ms per draft step |
|---|---|
| demo-eagle3 | {cost["eagle3_ms"][0]:.3f} ({cost["eagle3_ms"][1]:.3f}-{cost["eagle3_ms"][2]:.3f}) |
| demo-drafter | {cost["drafter_ms"][0]:.3f} ({cost["drafter_ms"][1]:.3f}-{cost["drafter_ms"][2]:.3f}) |
| ratio, per pair | {cost["ratio"][0]:.2f} ({cost["ratio"][1]:.2f}-{cost["ratio"][2]:.2f}) |

## License

Trained on CPython standard-library source (PSF License); released with spectool.
"""


def evaluate(args: argparse.Namespace, train_facts: dict) -> dict:
    torch.set_num_threads(args.threads)
    _, heldout, _ = streams()
    facts = {
        "train": train_facts,
        "shape": {"hidden_size": 256},
        "parity_max_abs": parity(heldout),
        "acceptance": acceptance(heldout, args),
        "draft_cost": draft_cost(args),
    }
    print(json.dumps({k: v for k, v in facts.items() if k != "train"}, indent=1), flush=True)
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--ttt-steps", type=int, default=3)
    parser.add_argument("--draft-vocab", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=704)
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--accept-prompts", type=int, default=50)
    parser.add_argument("--cost-rounds", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3, help="--bench: rounds per cell")
    parser.add_argument("--bench-tokens", type=int, default=48, help="--bench: new tokens")
    parser.add_argument("--eval-only", action="store_true")
    parser.add_argument("--bench", action="store_true")
    args = parser.parse_args()
    if args.bench:
        print(json.dumps(bench(args), indent=1))
        return
    if args.eval_only:
        train_facts = json.loads(FACTS_FILE.read_text())["train"]
    else:
        train_facts = train(args)
    facts = evaluate(args, train_facts)
    atomic_write_text(FACTS_FILE, json.dumps(facts, indent=1) + "\n")
    atomic_write_text(HEAD_DIR / "README.md", render_card(facts))


if __name__ == "__main__":
    main()
