"""Tiny real checkpoints for the server tests: random Llama models with a trained byte-level BPE.

The tokenizer is trained on a few KB of generated ASCII text, so every token decodes to valid
text (stop strings and streamed deltas can be compared exactly). The drafter is the target's
weights plus noise: it agrees with the target often, not always, so speculation really accepts
and rejects. Logits are peaked (init range 0.5): greedy outputs do not depend on batch make-up.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

torch.set_num_threads(1)  # the test machine's cores are shared

BOS = "<|bos|>"
EOS = "<|eos|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
WORDS = (
    "the draft model proposes tokens and the target verifies them in one forward pass so "
    "speculative decoding trades spare compute for fewer steps when batches are small while "
    "large batches leave no spare compute and the drafter only adds latency serving engines "
    "measure acceptance per position and choose a draft length for each concurrency level"
).split()


def _training_text(num_chars: int = 6000, seed: int = 0) -> str:
    rng = random.Random(seed)
    lines: list[str] = []
    size = 0
    while size < num_chars:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14)))
        line = line.capitalize() + rng.choice([".", "!", "?", ","]) + f" {rng.randint(0, 99)}"
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def write_bpe_tokenizer(folder: Path, vocab_size: int = 320) -> int:
    """Train a byte-level BPE on generated ASCII text; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS])
    tok.train_from_iterator(_training_text().splitlines(), trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": BOS,
                "eos_token": EOS,
                "add_bos_token": True,
                "chat_template": CHAT_TEMPLATE,
            }
        ),
        encoding="utf-8",
    )
    return tok.get_vocab_size(with_added_tokens=True)


def write_tiny_llama(folder: Path, *, seed: int = 0, noise: float = 0.0, **config: Any) -> Path:
    """A 2-layer, hidden-64 Llama with the BPE tokenizer, saved as a Hugging Face folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = write_bpe_tokenizer(folder)
    kwargs: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "initializer_range": 0.5,
        "max_position_embeddings": 4096,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
    }
    kwargs.update(config)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**kwargs)).eval()
    if noise > 0:
        generator = torch.Generator().manual_seed(seed + 1000)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn(param.shape, generator=generator) * noise)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("server-target"), seed=1)


@pytest.fixture(scope="session")
def drafter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target plus noise: accepts some drafts and rejects others."""
    return write_tiny_llama(tmp_path_factory.mktemp("server-drafter"), seed=1, noise=0.015)
