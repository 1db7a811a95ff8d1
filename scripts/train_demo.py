"""Train spectool's embedded demo model pair: a tiny Llama target and a drafter distilled from it.

Why: spectool's own engine, its server and its tests need a real (target, drafter) pair that
ships inside the package, loads offline in seconds on a CPU and has a drafter that is much
cheaper per token than its target, so that speculative decoding is worth it. Everything here
is rebuilt from data present on every machine (the running Python's standard library source)
with a fixed seed, so that re-running the script reproduces the shipped files.

Steps, in order:

1. Corpus: every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]`` in sorted order, minus
   ``site-packages`` (not the standard library) and minus folders named ``test``, ``tests`` or
   ``idle_test`` (CPython's own test suite: large, repetitive, not representative code). Every
   ``HOLDOUT_EVERY``-th file (by sorted index) is held out for evaluation.
2. Tokenizer: byte-level BPE trained with ``tokenizers`` on the training files only.
3. Target: ``LlamaForCausalLM`` trained from scratch with next-token cross-entropy.
4. Drafter: a one-layer ``LlamaForCausalLM`` distilled from the shipped (float16-rounded) target:
   forward KL to the target's distribution plus a little cross-entropy on the same corpus.
5. Both are saved as float16 safetensors Hugging Face folders (tokenizer files included), then
   reloaded from disk and measured: losses, drafter/target agreement and acceptance, and the
   per-token decode cost of each. The numbers go into ``README.md`` (the model card) and
   ``demo_training.json`` next to the folders.

Usage::

    python scripts/train_demo.py                 # full run, writes spectool/assets/models/
    python scripts/train_demo.py --quick         # smoke run of a few seconds, writes out/demo-quick/
    python scripts/train_demo.py --eval-only     # re-measure the shipped folders, rewrite the card

Uses ``--threads`` CPU threads (default 2) for torch and for the tokenizer trainer. Training
checkpoints every 50 steps under ``out/train_demo_state/``: re-running the same command after the
process was killed resumes where it stopped (bit-identically with the same thread count).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from spectool.io import atomic_write_text  # noqa: E402

DEFAULT_OUT_DIR = REPO_ROOT / "spectool" / "assets" / "models"
QUICK_OUT_DIR = REPO_ROOT / "out" / "demo-quick"
DEFAULT_STATE_DIR = REPO_ROOT / "out" / "train_demo_state"  # resumable checkpoints (git-ignored)
TARGET_DIRNAME = "demo-target"
DRAFTER_DIRNAME = "demo-drafter"
HELDOUT_SAMPLE_NAME = "heldout_sample.txt"

EXCLUDED_TOP_DIRS = ("site-packages",)
EXCLUDED_DIR_NAMES = ("test", "tests", "idle_test")
HOLDOUT_EVERY = 40  # file i (sorted) is held out when i % HOLDOUT_EVERY == HOLDOUT_OFFSET
HOLDOUT_OFFSET = 7

EOT = "<|endoftext|>"
PAD = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (EOT, PAD, IM_START, IM_END)  # ids 0..3 in this order
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ModelShape:
    """Llama hyper-parameters that differ between target and drafter."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int


TARGET_SHAPE = ModelShape(
    num_layers=12, hidden_size=256, intermediate_size=704, num_heads=4, num_kv_heads=2
)
DRAFTER_SHAPE = ModelShape(
    num_layers=1, hidden_size=128, intermediate_size=512, num_heads=2, num_kv_heads=1
)


@dataclass(frozen=True)
class RunConfig:
    """Every knob of one run; written verbatim into ``demo_training.json``."""

    seed: int = 0
    threads: int = 2
    vocab_size: int = 4096
    seq_len: int = 256  # tokens per training window
    max_position_embeddings: int = 1024
    batch_size: int = 16  # windows per step
    target_steps: int = 600
    target_lr: float = 2e-3
    drafter_steps: int = 300
    drafter_lr: float = 3e-3
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1  # cosine decay floor, as a fraction of the peak
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    distill_ce_weight: float = 0.1  # loss = (1 - w) * KL(target || drafter) + w * CE
    eval_windows: int = 24  # held-out windows of seq_len tokens for teacher-forced metrics
    chain_prompts: int = 50
    chain_prompt_len: int = 128
    chain_draft_len: int = 4
    decode_prompt_len: int = 32
    decode_steps: int = 64
    decode_rounds: int = 5
    decode_threads: tuple[int, ...] = (1, 2)  # torch threads for the decode-cost measurement
    max_train_files: int = 0  # 0 = all; --quick uses a few
    max_heldout_files: int = 0
    log_every: int = 20
    checkpoint_every: int = 50  # steps between resumable checkpoints
    precision: str = "bf16"  # training matmuls: bf16 autocast (fp32 master weights) or fp32
    quick: bool = False


QUICK_OVERRIDES = {
    "vocab_size": 512,
    "seq_len": 64,
    "max_position_embeddings": 256,
    "batch_size": 2,
    "target_steps": 3,
    "drafter_steps": 3,
    "warmup_steps": 1,
    "eval_windows": 2,
    "chain_prompts": 4,
    "chain_prompt_len": 16,
    "decode_prompt_len": 8,
    "decode_steps": 4,
    "decode_rounds": 1,
    "max_train_files": 24,
    "max_heldout_files": 2,
    "log_every": 1,
    "checkpoint_every": 2,
    "quick": True,
}


# ---------------------------------------------------------------------------------------------
# Corpus


def stdlib_root() -> Path:
    """The running interpreter's standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path) -> list[Path]:
    """Sorted ``*.py`` files of the standard library, without site-packages and test folders."""
    files = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if parts[0] in EXCLUDED_TOP_DIRS:
            continue
        if any(part in EXCLUDED_DIR_NAMES for part in parts[:-1]):
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def split_files(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """(train, held-out): every ``HOLDOUT_EVERY``-th file by sorted index is held out."""
    train = [p for i, p in enumerate(files) if i % HOLDOUT_EVERY != HOLDOUT_OFFSET]
    heldout = [p for i, p in enumerate(files) if i % HOLDOUT_EVERY == HOLDOUT_OFFSET]
    return train, heldout


def read_sources(files: list[Path]) -> list[str]:
    """Files as UTF-8 text (every 3.11 stdlib ``*.py`` file decodes strictly)."""
    return [p.read_bytes().decode("utf-8") for p in files]


# ---------------------------------------------------------------------------------------------
# Tokenizer


def train_tokenizer(texts: list[str], vocab_size: int):  # -> tokenizers.Tokenizer
    """Byte-level BPE over the training texts; special tokens take ids 0..3."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    for i, special in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(special) == i, (special, tok.token_to_id(special))
    return tok


def tokenizer_config(max_len: int) -> dict[str, object]:
    """``tokenizer_config.json``: generic fast-tokenizer class, so transformers 4.x and 5.x load it.

    The chat template sits here (older loaders) and in ``chat_template.jinja`` (newer ones).
    """
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOT,
        "eos_token": EOT,
        "pad_token": PAD,
        "additional_special_tokens": [IM_START, IM_END],
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def save_tokenizer(tok, dest: Path, max_len: int) -> None:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``chat_template.jinja``."""
    (dest / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    config = json.dumps(tokenizer_config(max_len), indent=2) + "\n"
    (dest / "tokenizer_config.json").write_text(config, encoding="utf-8")
    (dest / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")


def encode_stream(tok, texts: list[str]):  # -> torch.Tensor
    """One token stream: each document is ``<|endoftext|>`` followed by its tokens.  # (n,)"""
    import torch

    eot_id = tok.token_to_id(EOT)
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.append(eot_id)
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.long)


# ---------------------------------------------------------------------------------------------
# Models and training


def build_model(shape: ModelShape, run: RunConfig):  # -> LlamaForCausalLM
    """A freshly initialised Llama with ``shape``; seeded by the caller."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=run.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.hidden_size // shape.num_heads,
        max_position_embeddings=run.max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        bos_token_id=SPECIAL_TOKENS.index(EOT),
        eos_token_id=SPECIAL_TOKENS.index(EOT),
        pad_token_id=SPECIAL_TOKENS.index(PAD),
        attention_bias=False,
        mlp_bias=False,
    )
    return LlamaForCausalLM(config)


def lr_at(step: int, total_steps: int, peak_lr: float, run: RunConfig) -> float:
    """Linear warm-up then cosine decay to ``min_lr_ratio * peak_lr``."""
    if step < run.warmup_steps:
        return peak_lr * (step + 1) / run.warmup_steps
    progress = (step - run.warmup_steps) / max(1, total_steps - run.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return peak_lr * (run.min_lr_ratio + (1.0 - run.min_lr_ratio) * cosine)


def sample_windows(stream, batch_size: int, seq_len: int, gen):  # -> torch.Tensor
    """``batch_size`` random windows of ``seq_len + 1`` tokens.  # (b, seq_len + 1)"""
    import torch

    starts = torch.randint(0, stream.numel() - seq_len - 1, (batch_size,), generator=gen)
    return torch.stack([stream[s : s + seq_len + 1] for s in starts.tolist()])


def autocast(run: RunConfig):  # -> torch.autocast
    """bf16 autocast on CPU for ``precision="bf16"``: about 1.7x faster where the CPU has bf16
    matmul units (AVX512-BF16 / AMX); weights, optimizer state and losses stay float32."""
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=run.precision == "bf16")


def make_optimizer(model, lr: float, run: RunConfig):  # -> torch.optim.AdamW
    """AdamW; no weight decay on norms (1-D tensors)."""
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": run.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


@dataclass(frozen=True)
class Resume:
    """Checkpoints one training phase so that a killed run resumes where it stopped.

    Saves model, optimizer and data-generator state, the per-step log, the elapsed training
    time and the thread count of each stretch of steps every ``every`` steps; resuming with the
    same thread count is bit-identical to an uninterrupted run, with another one it differs by
    float rounding only. ``key`` names everything else the phase depends on: a checkpoint with
    another key is ignored.
    """

    path: Path
    key: str
    every: int

    threads: int

    def load(self, model, opt, gen) -> tuple[int, list, float, list[dict[str, int]]]:
        """(first step to run, log so far, elapsed seconds so far, thread count per stretch of
        steps); restores the states."""
        import torch

        fresh = (0, [], 0.0, [{"from_step": 0, "threads": self.threads}])
        if not self.path.is_file():
            return fresh
        state = torch.load(self.path, weights_only=True)
        if state["key"] != self.key:
            return fresh
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        gen.set_state(state["gen"])
        segments = state["segments"]
        if segments[-1]["threads"] != self.threads:
            segments.append({"from_step": state["step"], "threads": self.threads})
        print(f"resuming {self.path.name} at step {state['step']}", flush=True)
        return state["step"], state["log"], state["elapsed_s"], segments

    def save(
        self,
        step: int,
        model,
        opt,
        gen,
        log: list,
        elapsed_s: float,
        segments: list[dict[str, int]],
    ) -> None:
        """Write the checkpoint through a temporary file and a rename."""
        import torch

        self.path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "key": self.key,
            "step": step,
            "model": model.state_dict(),
            "optim": opt.state_dict(),
            "gen": gen.get_state(),
            "log": log,
            "elapsed_s": elapsed_s,
            "segments": segments,
        }
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.path)


def make_resume(state_dir: Path, phase: str, run: RunConfig, stream) -> Resume:
    """A :class:`Resume` whose file name and key cover the run config, shapes and versions."""
    import hashlib

    import torch

    key = json.dumps(
        {
            "phase": phase,
            "run": {k: v for k, v in asdict(run).items() if k not in ("log_every", "threads")},
            "target_shape": asdict(TARGET_SHAPE),
            "drafter_shape": asdict(DRAFTER_SHAPE),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "train_tokens": stream.numel(),
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]
    return Resume(
        path=state_dir / f"{phase}-{digest}.pt",
        key=key,
        every=run.checkpoint_every,
        threads=run.threads,
    )


def train_target(model, stream, run: RunConfig, resume: Resume) -> tuple[list[float], float, list]:
    """Next-token cross-entropy training; returns (the loss of every step in nats/token,
    training seconds summed over resumed runs, thread count per stretch of steps)."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(run.seed + 1)
    opt = make_optimizer(model, run.target_lr, run)
    first_step, losses, elapsed_before_s, segments = resume.load(model, opt, gen)
    model.train()
    t0 = time.perf_counter()
    for step in range(first_step, run.target_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, run.target_steps, run.target_lr, run)
        batch = sample_windows(stream, run.batch_size, run.seq_len, gen)  # (b, t + 1)
        with autocast(run):
            logits = model(input_ids=batch[:, :-1]).logits.float()  # (b, t, vocab)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), run.grad_clip)
        opt.step()
        losses.append(loss.item())
        elapsed_s = elapsed_before_s + time.perf_counter() - t0
        if (step + 1) % resume.every == 0 or step + 1 == run.target_steps:
            resume.save(step + 1, model, opt, gen, losses, elapsed_s, segments)
        if (step + 1) % run.log_every == 0 or step + 1 == run.target_steps:
            print(
                f"target  step {step + 1:4d}/{run.target_steps} loss {loss.item():.4f} "
                f"lr {opt.param_groups[0]['lr']:.2e} {elapsed_s:7.1f}s",
                flush=True,
            )
    model.eval()
    return losses, elapsed_before_s + time.perf_counter() - t0, segments


def distill_drafter(
    drafter, target, stream, run: RunConfig, resume: Resume
) -> tuple[list[dict[str, float]], float, list]:
    """KL(target || drafter) at temperature 1 plus a little CE; returns (per-step losses,
    training seconds summed over resumed runs, thread count per stretch of steps)."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(run.seed + 2)
    opt = make_optimizer(drafter, run.drafter_lr, run)
    first_step, log, elapsed_before_s, segments = resume.load(drafter, opt, gen)
    target.eval()
    drafter.train()
    w = run.distill_ce_weight
    t0 = time.perf_counter()
    for step in range(first_step, run.drafter_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, run.drafter_steps, run.drafter_lr, run)
        batch = sample_windows(stream, run.batch_size, run.seq_len, gen)  # (b, t + 1)
        with torch.no_grad(), autocast(run):
            t_logits = target(input_ids=batch[:, :-1]).logits  # (b, t, v)
        t_logp = F.log_softmax(t_logits.float(), dim=-1)
        with autocast(run):
            d_logits = drafter(input_ids=batch[:, :-1]).logits.float()  # (b, t, v)
        d_logp = F.log_softmax(d_logits, dim=-1)
        vocab = d_logits.size(-1)
        kl = F.kl_div(
            d_logp.reshape(-1, vocab),
            t_logp.reshape(-1, vocab),
            log_target=True,
            reduction="batchmean",
        )
        ce = F.nll_loss(d_logp.reshape(-1, vocab), batch[:, 1:].reshape(-1))
        loss = (1.0 - w) * kl + w * ce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), run.grad_clip)
        opt.step()
        log.append({"loss": loss.item(), "kl": kl.item(), "ce": ce.item()})
        elapsed_s = elapsed_before_s + time.perf_counter() - t0
        if (step + 1) % resume.every == 0 or step + 1 == run.drafter_steps:
            resume.save(step + 1, drafter, opt, gen, log, elapsed_s, segments)
        if (step + 1) % run.log_every == 0 or step + 1 == run.drafter_steps:
            print(
                f"drafter step {step + 1:4d}/{run.drafter_steps} loss {loss.item():.4f} "
                f"kl {kl.item():.4f} ce {ce.item():.4f} "
                f"lr {opt.param_groups[0]['lr']:.2e} {elapsed_s:7.1f}s",
                flush=True,
            )
    drafter.eval()
    return log, elapsed_before_s + time.perf_counter() - t0, segments


# ---------------------------------------------------------------------------------------------
# Saving and loading


def save_folder(model, tok, dest: Path, max_len: int) -> None:
    """Write a complete float16 HF folder to ``dest``, replacing it only once it is complete."""
    import torch
    from transformers import GenerationConfig

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        half = build_like(model).to(torch.float16)
        half.load_state_dict(model.state_dict())
        half.generation_config = GenerationConfig(
            bos_token_id=model.config.bos_token_id,
            eos_token_id=model.config.eos_token_id,
            pad_token_id=model.config.pad_token_id,
            do_sample=False,
        )
        half.save_pretrained(tmp, safe_serialization=True)
        save_tokenizer(tok, tmp, max_len)
        tmp.chmod(0o755)
        for path in tmp.iterdir():
            path.chmod(0o644)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def build_like(model):  # -> LlamaForCausalLM
    """A new model with ``model``'s config (weights are overwritten by the caller)."""
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(model.config)


def load_folder(path: Path):  # -> LlamaForCausalLM
    """A shipped folder as a float32 model in eval mode (float16 weights upcast exactly)."""
    import torch
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


# ---------------------------------------------------------------------------------------------
# Measurements


def eval_windows(stream, n: int, seq_len: int):  # -> torch.Tensor
    """``n`` evenly spaced windows of ``seq_len + 1`` tokens.  # (n, seq_len + 1)"""
    import torch

    last = stream.numel() - seq_len - 1
    n = min(n, max(1, last // (seq_len + 1)))
    starts = torch.linspace(0, last, n).long().tolist()
    return torch.stack([stream[s : s + seq_len + 1] for s in starts])


def teacher_forced(target, drafter, windows) -> dict[str, float]:
    """Per-position losses, greedy agreement and expected acceptance alpha on ``windows``.

    alpha(T) = mean over positions of sum_x min(p_T(x), q_T(x)), p = target, q = drafter, both
    softmaxed at temperature T: the probability that speculative sampling accepts a drafted token.
    """
    import torch
    import torch.nn.functional as F

    out: dict[str, list[float]] = {
        "target_loss": [],
        "drafter_loss": [],
        "greedy_agreement": [],
        "alpha_t1": [],
        "alpha_t07": [],
        "target_top1_acc": [],
    }
    with torch.inference_mode():
        for row in windows:
            x, y = row[None, :-1], row[1:]  # (1, t), (t,)
            p_logits = target(input_ids=x).logits[0]  # (t, vocab)
            q_logits = drafter(input_ids=x).logits[0]  # (t, vocab)
            out["target_loss"].append(F.cross_entropy(p_logits, y).item())
            out["drafter_loss"].append(F.cross_entropy(q_logits, y).item())
            agree = p_logits.argmax(-1) == q_logits.argmax(-1)
            out["greedy_agreement"].append(agree.float().mean().item())
            out["target_top1_acc"].append((p_logits.argmax(-1) == y).float().mean().item())
            for key, temp in (("alpha_t1", 1.0), ("alpha_t07", 0.7)):
                p = F.softmax(p_logits / temp, dim=-1)
                q = F.softmax(q_logits / temp, dim=-1)
                out[key].append(torch.minimum(p, q).sum(-1).mean().item())
    return {k: statistics.fmean(v) for k, v in out.items()} | {"tokens": windows[:, 1:].numel()}


def greedy_continuation(model, prompts, n_new: int):  # -> torch.Tensor
    """Greedy tokens after each prompt, incremental with a KV cache.  # (b, n_new)"""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        logits = model(input_ids=prompts, cache=cache, use_cache=True).logits  # (b, t, v)
        toks = [logits[:, -1].argmax(-1)]
        for _ in range(n_new - 1):
            logits = model(input_ids=toks[-1][:, None], cache=cache, use_cache=True).logits
            toks.append(logits[:, -1].argmax(-1))
    return torch.stack(toks, dim=1)


def chained_greedy(target, drafter, stream, run: RunConfig) -> dict[str, object]:
    """Draft k tokens greedily with the drafter; count how many match the target's greedy run.

    ``accept_rate_at_least[k-1]`` = fraction of prompts whose first k drafted tokens all equal
    the target's first k greedy tokens (what greedy speculative decoding accepts), and
    ``conditional_accept[k-1]`` = that fraction over the one for k - 1.
    """
    k = run.chain_draft_len
    prompts = eval_windows(stream, run.chain_prompts, run.chain_prompt_len)[:, :-1]  # (b, t)
    t_tokens = greedy_continuation(target, prompts, k)  # (b, k)
    d_tokens = greedy_continuation(drafter, prompts, k)  # (b, k)
    match = (t_tokens == d_tokens).long().cumprod(dim=1)  # (b, k): 1 while the prefix matches
    at_least = match.float().mean(dim=0).tolist()
    conditional = [
        at_least[0] if i == 0 else (at_least[i] / at_least[i - 1] if at_least[i - 1] else 0.0)
        for i in range(k)
    ]
    return {
        "prompts": prompts.size(0),
        "prompt_len": prompts.size(1),
        "draft_len": k,
        "accept_rate_at_least": at_least,
        "conditional_accept": conditional,
        "mean_accepted": float(match.sum(dim=1).float().mean()),
    }


class GreedyDecoder:
    """One model's batch-1 greedy decode with a KV cache, one timed step at a time."""

    def __init__(self, model, prompt) -> None:  # prompt: (1, t)
        import torch
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            logits = model(input_ids=prompt, cache=self.cache, use_cache=True).logits
        self.token = logits[:, -1:].argmax(-1)  # (1, 1)

    def step_ms(self) -> float:
        """Decode one token; returns its wall time in ms (forward + argmax)."""
        import torch

        with torch.inference_mode():
            t0 = time.perf_counter()
            logits = self.model(input_ids=self.token, cache=self.cache, use_cache=True).logits
            self.token = logits[:, -1:].argmax(-1)
            return (time.perf_counter() - t0) * 1e3


def loop_step_times_ms(target, drafter, prompt, run: RunConfig) -> tuple[list[float], list[float]]:
    """Per-step decode times (ms) of (target, drafter), alternating step by step so that other
    jobs on the machine slow both alike; each round restarts from the prompt."""
    target_ms: list[float] = []
    drafter_ms: list[float] = []
    for _ in range(run.decode_rounds):
        decoders = GreedyDecoder(target, prompt), GreedyDecoder(drafter, prompt)
        for decoder in decoders:  # warm-up
            decoder.step_ms()
        for _ in range(run.decode_steps):
            target_ms.append(decoders[0].step_ms())
            drafter_ms.append(decoders[1].step_ms())
    return target_ms, drafter_ms


def generate_ms_per_token(target, drafter, prompt, run: RunConfig) -> tuple[float, float]:
    """Per-token ms of ``generate`` (greedy, use_cache) for (target, drafter):
    (time(1 + steps new tokens) - time(1 new token)) / steps, each the best of 3 alternated runs."""
    import torch

    def timed_s(model, n_new: int) -> float:
        with torch.inference_mode():
            t0 = time.perf_counter()
            model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=n_new,
                min_new_tokens=n_new,
                do_sample=False,
                use_cache=True,
            )
            return time.perf_counter() - t0

    models = (target, drafter)
    lengths = (1, 1 + run.decode_steps)
    for model in models:
        timed_s(model, 2)  # warm-up
    best_s = {(m, n): math.inf for m in range(2) for n in lengths}
    for _ in range(3):
        for m, model in enumerate(models):
            for n in lengths:
                best_s[m, n] = min(best_s[m, n], timed_s(model, n))
    per_token_ms = [
        (best_s[m, lengths[1]] - best_s[m, 1]) / run.decode_steps * 1e3 for m in range(2)
    ]
    return per_token_ms[0], per_token_ms[1]


def decode_costs(target, drafter, stream, run: RunConfig) -> dict[str, object]:
    """Per-token decode cost of each model on CPU (batch 1, greedy, KV cache), in ms, for each
    thread count in ``run.decode_threads``.

    ``loop_*``: 20th percentile of single-step times (a low quantile resists other jobs on a
    shared machine; medians are kept too); ``generate_*``: transformers' ``generate`` loop.
    """
    import torch

    prompt = stream[: run.decode_prompt_len][None, :]  # (1, t)
    by_threads: dict[str, dict[str, float]] = {}
    try:
        for threads in run.decode_threads:
            torch.set_num_threads(threads)
            t_ms, d_ms = loop_step_times_ms(target, drafter, prompt, run)
            t_p20, d_p20 = statistics.quantiles(t_ms, n=5)[0], statistics.quantiles(d_ms, n=5)[0]
            t_gen, d_gen = generate_ms_per_token(target, drafter, prompt, run)
            by_threads[str(threads)] = {
                "loop_target_ms": t_p20,
                "loop_drafter_ms": d_p20,
                "loop_ratio": t_p20 / d_p20,
                "loop_target_median_ms": statistics.median(t_ms),
                "loop_drafter_median_ms": statistics.median(d_ms),
                "loop_median_ratio": statistics.median(t_ms) / statistics.median(d_ms),
                "generate_target_ms": t_gen,
                "generate_drafter_ms": d_gen,
                "generate_ratio": t_gen / d_gen,
            }
    finally:
        torch.set_num_threads(run.threads)
    return {
        "threads": by_threads,
        "matmul_params_ratio": matmul_params(target) / matmul_params(drafter),
    }


def matmul_params(model) -> int:
    """Weights read by matmuls per decoded token: every 2-D weight but the embedding lookup."""
    n = sum(
        p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed" not in name
    )
    # lm_head is tied to the embedding, so named_parameters lists it once, as the embedding.
    return n + model.config.vocab_size * model.config.hidden_size


def heldout_sample(texts: list[str], max_chars: int = 3000) -> str:
    """A few KB of typical held-out code for tests: the first held-out file of at least 8 KB with
    a top-level ``def`` or ``class``, from the first such line, cut at a line end."""

    def first_def(text: str) -> int:
        starts = [i for i in (text.find("\ndef "), text.find("\nclass ")) if i >= 0]
        return min(starts) + 1 if starts else -1

    text = next((t for t in texts if len(t) >= 8000 and first_def(t) >= 0), texts[0])
    start = max(0, first_def(text))
    chunk = text[start : start + max_chars]
    return chunk[: chunk.rfind("\n") + 1] if "\n" in chunk else chunk


# ---------------------------------------------------------------------------------------------
# Model card


def shape_row(name: str, shape: dict, n_params: int) -> str:
    """One markdown table row describing a model's architecture."""
    return (
        f"| {name} | {shape['num_layers']} | {shape['hidden_size']} | "
        f"{shape['intermediate_size']} | {shape['num_heads']} | {shape['num_kv_heads']} | "
        f"{shape['hidden_size'] // shape['num_heads']} | {n_params / 1e6:.2f} M |"
    )


def decode_rows(dc: dict) -> str:
    """Markdown rows of the decode-cost table, two per thread count."""
    rows = []
    for threads, m in dc["threads"].items():
        rows.append(
            f"| {threads} | plain loop | {m['loop_target_ms']:.3f} "
            f"({m['loop_target_median_ms']:.3f}) | {m['loop_drafter_ms']:.3f} "
            f"({m['loop_drafter_median_ms']:.3f}) | {m['loop_ratio']:.2f} "
            f"({m['loop_median_ratio']:.2f}) |"
        )
        rows.append(
            f"| {threads} | `generate` | {m['generate_target_ms']:.3f} | "
            f"{m['generate_drafter_ms']:.3f} | {m['generate_ratio']:.2f} |"
        )
    return "\n".join(rows) + "\n"


def threads_text(facts: dict) -> str:
    """Torch threads used for training, per stretch of steps where a resumed run changed them."""
    segments = facts.get("train_threads")
    if not segments:
        return f"{facts['threads']}"
    run = facts["run"]
    steps = {"target": run["target_steps"], "drafter": run["drafter_steps"]}
    parts = []
    for phase, stretches in segments.items():
        if len(stretches) == 1:
            parts.append(f"{phase} {stretches[0]['threads']}")
            continue
        ends = [s["from_step"] for s in stretches[1:]] + [steps[phase]]
        spans = " and ".join(
            f"{s['threads']} for steps {s['from_step'] + 1}-{end}"
            for s, end in zip(stretches, ends, strict=True)
        )
        parts.append(f"{phase} {spans} (stopped, then resumed with another thread count)")
    return "; ".join(parts)


def render_card(facts: dict) -> str:
    """The model card, ``README.md``, from the measured ``facts``."""
    run, corpus, sizes, wall = facts["run"], facts["corpus"], facts["sizes_bytes"], facts["wall_s"]
    ev, tr, ch, dc = (
        facts["eval"],
        facts["train_eval"],
        facts["chained_greedy"],
        facts["decode_cost"],
    )
    tshape, dshape = facts["target_shape"], facts["drafter_shape"]
    k = ch["draft_len"]
    positions = " | ".join(str(i + 1) for i in range(k))
    at_least = " | ".join(f"{x:.3f}" for x in ch["accept_rate_at_least"])
    conditional = " | ".join(f"{x:.3f}" for x in ch["conditional_accept"])
    precision = (
        "bf16 autocast (float32 weights, optimizer state and losses)"
        if run["precision"] == "bf16"
        else "float32"
    )
    tokens_per_step = run["batch_size"] * run["seq_len"]
    quick = "--quick " if run["quick"] else ""
    w_ce = run["distill_ce_weight"]
    return f"""# spectool demo models: `demo-target` and `demo-drafter`

Two tiny Llama checkpoints shipped inside spectool so that its engine, server and tests have a
real speculative-decoding pair offline. They continue Python-standard-library-style code; they are
not useful language models. Made by `scripts/train_demo.py` (seed {run["seed"]}); every number below
was measured by that script on the files in this folder (float16 weights upcast to float32).

Reproduce (Python {facts["python_version"]}, torch {facts["torch_version"]}, \
transformers {facts["transformers_version"]}, tokenizers {facts["tokenizers_version"]}):

```
python scripts/train_demo.py {quick}--seed {run["seed"]} --target-steps {run["target_steps"]} \\
    --drafter-steps {run["drafter_steps"]} --precision {run["precision"]}
```

Same versions and seed give the same losses up to float noise (bit-identical files on the same
machine with the same thread count). Another Python version has another standard library, hence another corpus and other
weights. `python scripts/train_demo.py --eval-only` re-measures the shipped folders and rewrites
this card and `demo_training.json` (timings vary with the machine and its load).

## Data

- Corpus: every `*.py` file under `sysconfig.get_paths()["stdlib"]` of CPython \
{facts["python_version"]}, sorted by relative path, without `site-packages/` (not the standard
library) and without any folder named `test`, `tests` or `idle_test` (CPython's own test suite):
{corpus["files"]} files, {corpus["bytes"] / 1e6:.2f} MB.
- Held out: file number i (0-based, sorted) when i % {HOLDOUT_EVERY} == {HOLDOUT_OFFSET}: \
{corpus["heldout_files"]} files, {corpus["heldout_tokens"]:,} tokens (paths in `demo_training.json`).
Training: the other {corpus["train_files"]} files, {corpus["train_tokens"]:,} tokens.
- Each document is `<|endoftext|>` followed by its tokens; training draws random windows of
{run["seq_len"]} tokens from the concatenated stream.
- `{HELDOUT_SAMPLE_NAME}`: {sizes[HELDOUT_SAMPLE_NAME]:,} bytes of held-out source, for tests.

## Tokenizer (identical files in both folders)

Byte-level BPE trained with `tokenizers` on the training files; vocabulary {run["vocab_size"]}, of
which ids 0-3 are special: `<|endoftext|>` (bos and eos), `<|pad|>` (pad), `<|im_start|>`,
`<|im_end|>`. GPT-2 byte-level pre-tokenizer without prefix space and byte-level decoder, so
decoding inverts encoding exactly; no post-processor, so nothing is added to encoded text.
{corpus["bytes_per_token"]:.2f} bytes of source per token on the training files. A ChatML-style
chat template (`chat_template.jinja`, also in `tokenizer_config.json`) is there for API plumbing
only: the models never saw chat text.

## Architecture

`LlamaForCausalLM`: SiLU MLP, RMSNorm (eps 1e-5), RoPE (theta 10000), no biases, tied input and
output embeddings, max_position_embeddings {run["max_position_embeddings"]} (trained on \
{run["seq_len"]}-token windows), float16 safetensors.

| model | layers | hidden | intermediate | heads | kv heads | head dim | parameters |
|---|---|---|---|---|---|---|---|
{shape_row("demo-target", tshape, facts["params"]["target"])}
{shape_row("demo-drafter", dshape, facts["params"]["drafter"])}

On disk: demo-target {sizes["demo-target"] / 1e6:.2f} MB, demo-drafter \
{sizes["demo-drafter"] / 1e6:.2f} MB, this folder in all {sizes["total"] / 1e6:.2f} MB.

## Training

- Torch threads: {threads_text(facts)}.
- Precision: {precision}.
- Optimizer: AdamW (betas 0.9/0.95, weight decay {run["weight_decay"]} on matrices),
  {run["warmup_steps"]} warm-up steps then cosine decay to {run["min_lr_ratio"]} x peak, gradient
  clipping {run["grad_clip"]}.
- Batch: {run["batch_size"]} x {run["seq_len"]} = {tokens_per_step:,} tokens per step.
- The drafter is distilled from the saved float16 target.

| | steps | peak LR | tokens seen | objective | wall time |
|---|---|---|---|---|---|
| demo-target | {run["target_steps"]} | {run["target_lr"]} | \
{run["target_steps"] * tokens_per_step:,} | cross-entropy | {wall["target_train"]:.0f} s |
| demo-drafter | {run["drafter_steps"]} | {run["drafter_lr"]} | \
{run["drafter_steps"] * tokens_per_step:,} | {1 - w_ce:.1f} x KL(target ‖ drafter) + {w_ce} x CE \
| {wall["drafter_train"]:.0f} s |

Wall time of the training steps, summed over resumed stretches (CPU: {facts["cpu"]}; the
figures move with the machine's other load): tokenizer training {wall["tokenizer"]:.0f} s,
encoding {wall["encode"]:.0f} s, in all {wall["training_total"]:.0f} s = \
{wall["training_total"] / 60:.1f} min.

## Losses (nats per token)

Train (last 20): mean of the last 20 steps' batch losses. Eval columns: teacher-forced over
{ev["tokens"]:,} tokens in {run["eval_windows"]} evenly spaced {run["seq_len"]}-token windows of
each stream, on the shipped weights. A uniform model scores {math.log(run["vocab_size"]):.3f}.

| | train (last 20) | train (eval) | held-out | held-out top-1 accuracy |
|---|---|---|---|---|
| demo-target | {facts["target_train_loss_last20"]:.3f} | {tr["target_loss"]:.3f} | \
{ev["target_loss"]:.3f} | {ev["target_top1_acc"]:.3f} |
| demo-drafter | CE {facts["drafter_train_ce_last20"]:.3f}, KL \
{facts["drafter_train_kl_last20"]:.3f} | {tr["drafter_loss"]:.3f} | {ev["drafter_loss"]:.3f} | |

## Drafter acceptance against the target (held-out text)

Teacher-forced, per position, over the same {ev["tokens"]:,} held-out tokens:

| metric | value |
|---|---|
| greedy agreement: drafter argmax == target argmax | {ev["greedy_agreement"]:.3f} |
| expected sampled acceptance α = E[Σ_x min(p(x), q(x))], T = 1 | {ev["alpha_t1"]:.3f} |
| expected sampled acceptance α, T = 0.7 | {ev["alpha_t07"]:.3f} |

Chained greedy acceptance: {ch["prompts"]} held-out prompts of {ch["prompt_len"]} tokens; the
drafter drafts {k} tokens greedily and the target decodes {k} tokens greedily; position k is
accepted when drafted tokens 1..k all equal the target's.

| position k | {positions} |
|---|{"---|" * k}
| P(accepted ≥ k) | {at_least} |
| P(k accepted, given k-1 accepted) | {conditional} |

Mean accepted draft tokens per round at draft length {k}: {ch["mean_accepted"]:.2f}.

## Decode cost (CPU, batch 1, greedy, KV cache)

float32, {run["decode_prompt_len"]}-token prompt. Plain loop: one
`model(input_ids=last_token, cache=DynamicCache, use_cache=True)` call plus argmax per token,
{run["decode_rounds"]} rounds of {run["decode_steps"]} tokens, the two models alternating token by
token; the table gives the 20th percentile of the step times (a low quantile resists other jobs
on a shared machine), the median in parentheses. `generate`: (time of
`generate(max_new_tokens={run["decode_steps"] + 1})` - time of `generate(max_new_tokens=1)`) /
{run["decode_steps"]}, greedy, use_cache, best of 3 alternated runs.

| torch threads | timing | demo-target (ms/token) | demo-drafter (ms/token) | ratio |
|---|---|---|---|---|
{decode_rows(dc)}
Matmul weights read per token (lm_head included), target / drafter: \
{dc["matmul_params_ratio"]:.2f}.

At this size a forward pass costs mostly fixed per-layer overhead (operator dispatch, Python), so
the ratio follows the layer count ({tshape["num_layers"]} vs {dshape["num_layers"]}) more than the
parameter count, and `generate`'s own per-token overhead narrows it; other engines and machines
give other ratios.

## License

Trained on CPython standard-library source (PSF License); `{HELDOUT_SAMPLE_NAME}` is an excerpt
of it. The weights are released with spectool.
"""


# ---------------------------------------------------------------------------------------------
# Main


def folder_bytes(path: Path) -> int:
    """Total size of the files under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo where there is one, else what ``platform`` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def parse_args(argv: list[str] | None) -> tuple[RunConfig, Path, Path, bool]:
    """Command line -> (run config, output folder, checkpoint folder, eval-only)."""
    defaults = RunConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help=f"output folder (default {DEFAULT_OUT_DIR}, or {QUICK_OUT_DIR} with --quick)",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--target-steps", type=int, default=None, help="target optimizer steps")
    parser.add_argument("--drafter-steps", type=int, default=None, help="drafter optimizer steps")
    parser.add_argument("--threads", type=int, default=defaults.threads, help="CPU threads")
    parser.add_argument(
        "--precision",
        choices=("bf16", "fp32"),
        default=defaults.precision,
        help="training matmul precision (bf16 autocast needs a CPU with bf16 units to be fast)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run of a few seconds on a few files"
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help="where resumable training checkpoints go (a killed run resumes from them)",
    )
    parser.add_argument(
        "--eval-only",
        action="store_true",
        help="no training: re-measure the folders in --out-dir with the settings recorded in its "
        "demo_training.json, and rewrite that file and README.md",
    )
    args = parser.parse_args(argv)
    run = RunConfig(seed=args.seed, threads=args.threads, precision=args.precision)
    if args.quick:
        run = replace(run, **QUICK_OVERRIDES)
    if args.target_steps is not None:
        run = replace(run, target_steps=args.target_steps)
    if args.drafter_steps is not None:
        run = replace(run, drafter_steps=args.drafter_steps)
    out_dir = args.out_dir or (QUICK_OUT_DIR if args.quick else DEFAULT_OUT_DIR)
    return run, out_dir.resolve(), args.state_dir.resolve(), args.eval_only


@dataclass(frozen=True)
class Corpus:
    """The split corpus as text, with the files it came from."""

    root: Path
    all_files: list[Path]
    train_files: list[Path]
    heldout_files: list[Path]
    train_texts: list[str]
    heldout_texts: list[str]


def load_corpus(run: RunConfig) -> Corpus:
    """Read and split the standard library (trimmed to a few files with ``--quick``)."""
    root = stdlib_root()
    files = stdlib_files(root)
    train_files, heldout_files = split_files(files)
    if run.max_train_files:
        train_files = train_files[: run.max_train_files]
    if run.max_heldout_files:
        heldout_files = heldout_files[: run.max_heldout_files]
    print(f"corpus: {root}: {len(train_files)} train files, {len(heldout_files)} held out")
    return Corpus(
        root=root,
        all_files=files,
        train_files=train_files,
        heldout_files=heldout_files,
        train_texts=read_sources(train_files),
        heldout_texts=read_sources(heldout_files),
    )


def train_pair(run: RunConfig, corpus: Corpus, out_dir: Path, state_dir: Path) -> dict:
    """Tokenizer, target, drafter: train, save both folders; returns the training facts."""
    import tokenizers
    import torch
    import transformers

    wall: dict[str, float] = {}
    t0 = time.perf_counter()
    tok = train_tokenizer(corpus.train_texts, run.vocab_size)
    wall["tokenizer"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    train_stream = encode_stream(tok, corpus.train_texts)  # (n_train,)
    heldout_stream = encode_stream(tok, corpus.heldout_texts)  # (n_heldout,)
    wall["encode"] = time.perf_counter() - t0
    train_bytes = sum(len(t.encode("utf-8")) for t in corpus.train_texts)
    print(
        f"tokenizer: {wall['tokenizer']:.1f}s; {train_stream.numel():,} train tokens, "
        f"{heldout_stream.numel():,} held-out tokens, {train_bytes / train_stream.numel():.2f} B/token"
    )

    torch.manual_seed(run.seed)
    target = build_model(TARGET_SHAPE, run)
    target_resume = make_resume(state_dir, "target", run, train_stream)
    target_losses, wall["target_train"], target_threads = train_target(
        target, train_stream, run, target_resume
    )
    save_folder(target, tok, out_dir / TARGET_DIRNAME, run.max_position_embeddings)
    target = load_folder(out_dir / TARGET_DIRNAME)  # distil from exactly what ships

    torch.manual_seed(run.seed + 100)
    drafter = build_model(DRAFTER_SHAPE, run)
    drafter_resume = make_resume(state_dir, "drafter", run, train_stream)
    drafter_log, wall["drafter_train"], drafter_threads = distill_drafter(
        drafter, target, train_stream, run, drafter_resume
    )
    save_folder(drafter, tok, out_dir / DRAFTER_DIRNAME, run.max_position_embeddings)
    wall["training_total"] = (
        wall["tokenizer"] + wall["encode"] + wall["target_train"] + wall["drafter_train"]
    )
    for resume in (target_resume, drafter_resume):
        resume.path.unlink(missing_ok=True)

    last = min(20, len(target_losses))
    return {
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "tokenizers_version": tokenizers.__version__,
        "cpu": cpu_name(),
        "threads": torch.get_num_threads(),
        "train_threads": {"target": target_threads, "drafter": drafter_threads},
        "run": asdict(run),
        "target_shape": asdict(TARGET_SHAPE),
        "drafter_shape": asdict(DRAFTER_SHAPE),
        "corpus": {
            "stdlib": str(corpus.root),
            "files": len(corpus.all_files),
            "bytes": sum(p.stat().st_size for p in corpus.all_files),
            "train_files": len(corpus.train_files),
            "heldout_files": len(corpus.heldout_files),
            "train_tokens": train_stream.numel(),
            "heldout_tokens": heldout_stream.numel(),
            "bytes_per_token": train_bytes / train_stream.numel(),
            "heldout_paths": [p.relative_to(corpus.root).as_posix() for p in corpus.heldout_files],
        },
        "wall_s": wall,
        "target_train_losses": target_losses,
        "target_train_loss_last20": statistics.fmean(target_losses[-last:]),
        "drafter_train_ce_last20": statistics.fmean(d["ce"] for d in drafter_log[-last:]),
        "drafter_train_kl_last20": statistics.fmean(d["kl"] for d in drafter_log[-last:]),
        "drafter_train_log": drafter_log,
    }


def measure_pair(run: RunConfig, corpus: Corpus, out_dir: Path) -> dict:
    """Reload both shipped folders and measure them; returns the evaluation facts."""
    from tokenizers import Tokenizer

    t0 = time.perf_counter()
    tok = Tokenizer.from_file(str(out_dir / TARGET_DIRNAME / "tokenizer.json"))
    train_stream = encode_stream(tok, corpus.train_texts)  # (n_train,)
    heldout_stream = encode_stream(tok, corpus.heldout_texts)  # (n_heldout,)
    target = load_folder(out_dir / TARGET_DIRNAME)
    drafter = load_folder(out_dir / DRAFTER_DIRNAME)
    heldout_windows = eval_windows(heldout_stream, run.eval_windows, run.seq_len)
    train_windows = eval_windows(train_stream, run.eval_windows, run.seq_len)
    facts = {
        "eval": teacher_forced(target, drafter, heldout_windows),
        "train_eval": teacher_forced(target, drafter, train_windows),
        "chained_greedy": chained_greedy(target, drafter, heldout_stream, run),
        "decode_cost": decode_costs(target, drafter, heldout_stream, run),
        "params": {
            "target": sum(p.numel() for p in target.parameters()),
            "drafter": sum(p.numel() for p in drafter.parameters()),
        },
        "evaluation_wall_s": time.perf_counter() - t0,
    }
    return facts


def write_outputs(facts: dict, out_dir: Path) -> None:
    """``demo_training.json`` and the model card, with the folder's final total size."""
    sizes = {
        TARGET_DIRNAME: folder_bytes(out_dir / TARGET_DIRNAME),
        DRAFTER_DIRNAME: folder_bytes(out_dir / DRAFTER_DIRNAME),
        HELDOUT_SAMPLE_NAME: (out_dir / HELDOUT_SAMPLE_NAME).stat().st_size,
    }
    facts["sizes_bytes"] = sizes | {"total": 0}
    # Write twice: the second pass records the total including the card and this file.
    for _ in range(2):
        atomic_write_text(out_dir / "demo_training.json", json.dumps(facts, indent=1) + "\n")
        atomic_write_text(out_dir / "README.md", render_card(facts))
        facts["sizes_bytes"]["total"] = folder_bytes(out_dir)
    for name in ("demo_training.json", "README.md", HELDOUT_SAMPLE_NAME):
        (out_dir / name).chmod(0o644)  # mkstemp makes 0600 files; these are package data


def main(argv: list[str] | None = None) -> int:
    """Train (unless ``--eval-only``), measure, and write the folders, card and facts file."""
    run, out_dir, state_dir, eval_only = parse_args(argv)
    os.environ["RAYON_NUM_THREADS"] = str(run.threads)  # the tokenizers trainer's thread pool
    os.environ["TOKENIZERS_PARALLELISM"] = "true"

    import torch
    import transformers

    torch.set_num_threads(run.threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    if eval_only:
        facts = json.loads((out_dir / "demo_training.json").read_text(encoding="utf-8"))
        run = replace(RunConfig(**facts["run"]), threads=run.threads)
        corpus = load_corpus(run)
        if facts["python_version"] != platform.python_version():
            print(f"warning: trained on Python {facts['python_version']}: other held-out text")
    else:
        corpus = load_corpus(run)
        facts = train_pair(run, corpus, out_dir, state_dir)
    measured = measure_pair(run, corpus, out_dir)
    facts |= {k: v for k, v in measured.items() if k != "evaluation_wall_s"}
    facts["wall_s"]["evaluation"] = measured["evaluation_wall_s"]
    atomic_write_text(out_dir / HELDOUT_SAMPLE_NAME, heldout_sample(corpus.heldout_texts))
    write_outputs(facts, out_dir)

    ev, chain, costs = facts["eval"], facts["chained_greedy"], facts["decode_cost"]
    print(
        f"held-out loss target {ev['target_loss']:.3f} drafter {ev['drafter_loss']:.3f}; "
        f"greedy agreement {ev['greedy_agreement']:.3f}; "
        f"alpha T=1 {ev['alpha_t1']:.3f} T=0.7 {ev['alpha_t07']:.3f}"
    )
    print(f"chained greedy P(accepted >= k): {chain['accept_rate_at_least']}")
    for threads, m in costs["threads"].items():
        print(
            f"decode ms/token, {threads} thread(s): loop target {m['loop_target_ms']:.3f} "
            f"drafter {m['loop_drafter_ms']:.3f} ratio {m['loop_ratio']:.2f} (median ratio "
            f"{m['loop_median_ratio']:.2f}); generate ratio {m['generate_ratio']:.2f}"
        )
    print(f"wall: {json.dumps({k: round(v, 1) for k, v in facts['wall_s'].items()})}")
    print(f"wrote {out_dir} ({facts['sizes_bytes']['total'] / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
