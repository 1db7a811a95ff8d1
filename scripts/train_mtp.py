"""Train the MTP module of ``spectool:demo-target-mtp`` on the frozen ``demo-target``.

What is trained: one multi-token-prediction module in DeepSeek-V3's layout
(:mod:`spectool.engine.mtp_module` cites the sources): at position p it reads the target's
final-normed hidden state H_p and the embedding of token p + 1,
``x = eh_proj(cat([enorm(embed), hnorm(H_p)]))``, runs one decoder layer over x, and
``shared_head.norm`` of the result, multiplied by the target's (tied) LM head, predicts token
p + 2. Embeddings and LM head are the target's and stay frozen.

The decoder layer starts as a copy of the target's last layer and learns rank-``--rank``
updates ``B @ A`` of its seven projections (its two norms are trained in full), so that the
shipped file holds the module in 0.35 MB instead of 2 MB (spectool/builtin_models.py says why
and assembles the full checkpoint). ``eh_proj`` starts as ``[N(0, 0.02) | I]`` (the hidden
state passed through, the embedding mixed in as it learns).

Objective: soft cross-entropy to the target's next-token distribution at p + 1 (the
distribution verification samples from), over a training-time test of ``--ttt-steps`` chain
steps weighted 0.8^s, as ``scripts/train_eagle3.py`` does: step s >= 1 feeds the module's own
step s-1 output at the position before (TensorRT-LLM's MTP-Eagle re-application, which the
engine drafts with for k > 1) with the true next token, attending as the engine's chain does.

Data: the demo corpus (CPython standard-library source, demo-target's tokenizer, the same
held-out files as ``scripts/train_demo.py``), random windows of ``--seq-len`` tokens.

Usage::

    python scripts/train_mtp.py                  # train, save, measure, write the card
    python scripts/train_mtp.py --eval-only      # re-measure the shipped module, rewrite the card

Outputs ``spectool/assets/models/demo-target-mtp/`` (config.json, mtp.safetensors, README.md,
mtp_training.json); the measurements are in ``scripts/measure_mtp.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "scripts"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from spectool.io import atomic_write_bytes, atomic_write_text  # noqa: E402

MODELS = REPO_ROOT / "spectool" / "assets" / "models"
TARGET_DIR = MODELS / "demo-target"
OUT_DIR = MODELS / "demo-target-mtp"
FACTS_FILE = OUT_DIR / "mtp_training.json"
PROJECTIONS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:  # x [B, H, T, D]
    """Rotary embedding in Hugging Face's rotate-half layout."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class TrainMtp(nn.Module):
    """The MTP module in Hugging Face's tensor layout, its decoder layer as base + ``B @ A``."""

    def __init__(self, cfg: dict, base: dict[str, Tensor], rank: int, seed: int) -> None:
        super().__init__()
        dim = cfg["hidden_size"]
        self.heads, self.kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg["head_dim"]
        self.eps = cfg["rms_norm_eps"]
        gen = torch.Generator().manual_seed(seed)
        self.enorm = nn.Parameter(torch.ones(dim))
        self.hnorm = nn.Parameter(torch.ones(dim))
        eh = torch.cat([torch.randn(dim, dim, generator=gen) * 0.02, torch.eye(dim)], dim=1)
        self.eh_proj = nn.Parameter(eh)  # [dim, 2 dim]: [embedding | hidden]
        self.input_layernorm = nn.Parameter(base["input_layernorm"].clone())
        self.post_attention_layernorm = nn.Parameter(base["post_attention_layernorm"].clone())
        self.head_norm = nn.Parameter(base["norm"].clone())  # shared_head.norm
        self.base = {p: base[p] for p in PROJECTIONS}  # frozen [out, in]
        self.lora_a = nn.ParameterDict()
        self.lora_b = nn.ParameterDict()
        for p in PROJECTIONS:
            out_f, in_f = self.base[p].shape
            key = p.replace(".", "_")
            a = torch.randn(rank, in_f, generator=gen) / in_f**0.5
            self.lora_a[key] = nn.Parameter(a)
            self.lora_b[key] = nn.Parameter(torch.zeros(out_f, rank))

    def weight(self, p: str) -> Tensor:
        key = p.replace(".", "_")
        return self.base[p] + self.lora_b[key] @ self.lora_a[key]

    def rms(self, x: Tensor, w: Tensor) -> Tensor:
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def step(
        self,
        embeds: Tensor,  # [B, T, dim] token p + 1
        hidden: Tensor,  # [B, T, dim] H_p (or the previous chain step's output)
        rope: tuple[Tensor, Tensor],  # cos, sin [T, D]
        past: list[tuple[Tensor, Tensor]],
        mask: Tensor,  # [T, (len(past) + 1) * T] bool, True = visible
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        bsz, seq, _ = embeds.shape
        both = torch.cat([self.rms(embeds, self.enorm), self.rms(hidden, self.hnorm)], -1)
        x = F.linear(both, self.eh_proj)
        h_in = self.rms(x, self.input_layernorm)
        q = F.linear(h_in, self.weight("self_attn.q_proj"))
        k = F.linear(h_in, self.weight("self_attn.k_proj"))
        v = F.linear(h_in, self.weight("self_attn.v_proj"))
        q = q.view(bsz, seq, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(bsz, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(bsz, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        groups = self.heads // self.kv_heads
        keys = torch.cat([p[0] for p in past] + [k], dim=2).repeat_interleave(groups, dim=1)
        values = torch.cat([p[1] for p in past] + [v], dim=2).repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        h = x + F.linear(y.transpose(1, 2).reshape(bsz, seq, -1), self.weight("self_attn.o_proj"))
        g = self.rms(h, self.post_attention_layernorm)
        gate = F.linear(g, self.weight("mlp.gate_proj"))
        up = F.linear(g, self.weight("mlp.up_proj"))
        out = h + F.linear(F.silu(gate) * up, self.weight("mlp.down_proj"))
        return self.rms(out, self.head_norm), (k, v)


def base_tensors(num_layers: int) -> dict[str, Tensor]:
    """demo-target's last decoder layer (names without the prefix) and final norm, float32."""
    from safetensors.torch import load_file

    raw = load_file(str(TARGET_DIR / "model.safetensors"))
    prefix = f"model.layers.{num_layers - 1}."
    out = {p: raw[prefix + p + ".weight"].float() for p in PROJECTIONS}
    for norm in ("input_layernorm", "post_attention_layernorm"):
        out[norm] = raw[prefix + norm + ".weight"].float()
    out["norm"] = raw["model.norm.weight"].float()
    return out


def ttt_loss(
    module: TrainMtp,
    lm_head: Tensor,  # [dim, V] the target's (engine layout)
    embeds: Tensor,  # [B, T - 1, dim] token p + 1 at position p
    hidden: Tensor,  # [B, T - 1, dim] H_p
    labels: Tensor,  # [B, T - 1, V] the target's distribution of token p + 2
    rope: tuple[Tensor, Tensor],
    masks: list[Tensor],
) -> tuple[Tensor, list[float]]:
    """Training-time test: step s predicts token p + 2 at position p for p >= s."""
    seq = embeds.shape[1]
    past: list[tuple[Tensor, Tensor]] = []
    total = embeds.new_zeros(())
    per_step = []
    for s, mask in enumerate(masks):
        out, kv = module.step(embeds, hidden, rope, past, mask[:seq, : (s + 1) * seq])
        past.append(kv)
        logp = F.log_softmax(out[:, s:] @ lm_head, dim=-1)
        loss = -(labels[:, s:] * logp).sum(-1).mean()
        total = total + (0.8**s) * loss
        per_step.append(float(loss.detach()))
        hidden = torch.cat([out[:, :1], out[:, :-1]], dim=1)  # step s + 1 reads p - 1
    return total, per_step


def train(args: argparse.Namespace) -> dict[str, object]:
    from train_eagle3 import lr_at, streams, ttt_masks

    from spectool.engine.load import load_model
    from spectool.engine.model import rope_tables

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    train_stream, _, corpus = streams()
    encode_s = time.perf_counter() - t0
    target = load_model(TARGET_DIR, max_seq_len=args.seq_len, pack_fp16=False).eval()
    targs = target.args
    last = targs.n_layers - 1
    cfg = json.loads((TARGET_DIR / "config.json").read_text())
    module = TrainMtp(cfg, base_tensors(targs.n_layers), args.rank, args.seed)
    embed = target.tok_embeddings.weight.detach()
    lm_head = target.output.weight.detach()  # [dim, V]
    rope = tuple(t[: args.seq_len - 1] for t in rope_tables(targs, args.seq_len))
    masks = ttt_masks(args.seq_len - 1, args.ttt_steps)
    opt = torch.optim.AdamW(module.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    log: list[dict[str, object]] = []
    t_train = time.perf_counter()
    for step in range(args.steps):
        starts = torch.randint(0, train_stream.numel() - args.seq_len, (args.batch,), generator=gen)
        window = torch.stack([train_stream[s : s + args.seq_len] for s in starts.tolist()])
        with torch.no_grad():
            positions = torch.arange(args.seq_len).expand(args.batch, -1)
            logits, feats = target(window, positions, hidden_layers=(last,))
            hidden = target.norm(feats)[:, :-1]  # H_p, final-normed
            labels = F.softmax(logits[:, 1:].float(), dim=-1)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        loss, per_step = ttt_loss(
            module, lm_head, embed[window[:, 1:]], hidden, labels, rope, masks
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            elapsed = time.perf_counter() - t_train
            log.append({"step": step, "loss_per_ttt_step": per_step, "s": round(elapsed, 1)})
            print(f"step {step} loss {[round(x, 3) for x in per_step]} {elapsed:.0f}s", flush=True)
    train_s = time.perf_counter() - t_train
    save_module(module, cfg, last, args.rank)
    return {
        "seed": args.seed,
        "threads": args.threads,
        "steps": args.steps,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "lr": args.lr,
        "warmup": args.warmup,
        "ttt_steps": args.ttt_steps,
        "rank": args.rank,
        "base_layer": last,
        "corpus": corpus,
        "encode_s": round(encode_s, 1),
        "train_s": round(train_s, 1),
        "log": log,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }


def save_module(module: TrainMtp, cfg: dict, base_layer: int, rank: int) -> None:
    """``mtp.safetensors`` (float16, the packed form) and config.json (the target's plus
    ``num_nextn_predict_layers: 1``)."""
    from safetensors.torch import save

    prefix = f"model.layers.{cfg['num_hidden_layers']}."
    tensors = {
        "enorm.weight": module.enorm,
        "hnorm.weight": module.hnorm,
        "eh_proj.weight": module.eh_proj,
        "input_layernorm.weight": module.input_layernorm,
        "post_attention_layernorm.weight": module.post_attention_layernorm,
        "shared_head.norm.weight": module.head_norm,
    }
    for p in PROJECTIONS:
        key = p.replace(".", "_")
        tensors[p + ".lora_A"] = module.lora_a[key]
        tensors[p + ".lora_B"] = module.lora_b[key]
    out = {prefix + k: v.detach().to(torch.float16).contiguous() for k, v in tensors.items()}
    meta = {"base_model": "demo-target", "base_layer": str(base_layer), "rank": str(rank)}
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(OUT_DIR / "mtp.safetensors", save(out, metadata=meta))
    config = {**cfg, "num_nextn_predict_layers": 1}
    atomic_write_text(OUT_DIR / "config.json", json.dumps(config, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--ttt-steps", type=int, default=3)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--accept-prompts", type=int, default=50)
    parser.add_argument("--cost-rounds", type=int, default=12)
    parser.add_argument("--eval-only", action="store_true")
    parser.add_argument("--no-eval", action="store_true", help="train and save only")
    args = parser.parse_args()
    if args.eval_only:
        train_facts = json.loads(FACTS_FILE.read_text())["train"]
    else:
        train_facts = train(args)
        atomic_write_text(FACTS_FILE, json.dumps({"train": train_facts}, indent=1) + "\n")
    if args.no_eval:
        return
    from measure_mtp import evaluate, render_card

    facts = evaluate(args, train_facts)
    atomic_write_text(FACTS_FILE, json.dumps(facts, indent=1) + "\n")
    atomic_write_text(OUT_DIR / "README.md", render_card(facts))


if __name__ == "__main__":
    main()
