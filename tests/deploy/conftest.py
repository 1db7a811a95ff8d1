"""Fixtures for build/serve tests: real fixture checkpoints (sparse) and tiny real Llama models.

The tiny models are random 2-layer Llamas with a byte-level BPE trained on a few lines, so the
embedded engine really loads and serves them in a second or two on a CPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

TEXT = "the draft model proposes tokens and the target verifies them in one pass " * 20


def _tokenizer(folder: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"])
    tok.train_from_iterator([TEXT], trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return tok.get_vocab_size(with_added_tokens=True)


def write_tiny_llama(folder: Path, seed: int) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "vocab_size": _tokenizer(folder),
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 512,
        "bos_token_id": 0,
        "eos_token_id": 1,
    }
    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return write_tiny_llama(root / "target", 1), write_tiny_llama(root / "drafter", 2)
