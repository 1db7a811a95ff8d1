"""Tiny random Llama / Qwen2 / Qwen3 checkpoints written as real Hugging Face folders.

transformers only builds and saves them (and serves as the reference in parity tests); the
engine under test reads the folders with its own loader. A word-level tokenizer whose tokens are
``t0 .. t{V-1}`` (``<bos>`` = 0, ``<eos>`` = 1) goes beside every model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch  # noqa: TID253 (engine tests use torch throughout)

BOS_ID = 0
EOS_ID = 1


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<bos>": BOS_ID, "<eos>": EOS_ID}
    vocab.update({f"t{i}": i for i in range(2, vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<bos>", "<eos>"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}), encoding="utf-8"
    )


def write_checkpoint(
    folder: Path,
    arch: str = "llama",
    *,
    seed: int = 0,
    vocab_size: int = 64,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 64,
    init_range: float = 0.5,
    tie: bool = False,
    max_shard_size: str | None = None,
    noise: float = 0.0,
    save_dtype: torch.dtype = torch.float32,
    **extra: Any,
) -> Path:
    """Save a random ``arch`` model (llama, qwen2, qwen3) with a tokenizer into ``folder``.

    ``noise`` > 0 perturbs every weight after the seeded init: the same ``seed`` with a little
    noise gives a drafter that agrees with the target often, but not always. ``save_dtype``:
    the safetensors' dtype (``torch.float16``: a float16 checkpoint like the demo pair).
    """
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    classes = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    }
    config_cls, model_cls = classes[arch]
    kwargs: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "intermediate_size": intermediate_size,
        "initializer_range": init_range,
        "tie_word_embeddings": tie,
        "max_position_embeddings": 256,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "rms_norm_eps": 1e-6,
    }
    kwargs.update(extra)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).eval()
    with torch.no_grad():  # random norms so that a wrong norm mapping cannot go unnoticed
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                param.normal_(0.0, init_range)
        if noise > 0:
            noise_gen = torch.Generator().manual_seed(seed + 1000)
            for param in model.parameters():
                param.add_(torch.randn(param.shape, generator=noise_gen) * noise)
    model = model.to(save_dtype)
    folder.mkdir(parents=True, exist_ok=True)
    save_kwargs: dict[str, Any] = {"safe_serialization": True}
    if max_shard_size is not None:
        save_kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(folder, **save_kwargs)
    write_tokenizer(folder, vocab_size)
    return folder


def chi_square_pvalue(
    counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0
) -> float:
    """Pearson chi-square goodness-of-fit p-value of observed ``counts`` against ``probs``.

    Cells expected fewer than ``min_expected`` times are pooled into one cell; a count in a cell
    of probability 0 gives p = 0. The p-value is the regularized upper incomplete gamma
    ``Q(df / 2, stat / 2)`` (no scipy needed).
    """
    counts = counts.flatten().double()
    probs = probs.flatten().double()
    if bool((counts[probs == 0] > 0).any()):
        return 0.0
    expected = probs / probs.sum() * counts.sum()
    small = expected < min_expected
    observed_cells = [counts[~small]]
    expected_cells = [expected[~small]]
    if bool(small.any()) and float(expected[small].sum()) > 0:
        observed_cells.append(counts[small].sum().view(1))
        expected_cells.append(expected[small].sum().view(1))
    observed = torch.cat(observed_cells)
    expect = torch.cat(expected_cells)
    stat = ((observed - expect) ** 2 / expect).sum()
    dof = observed.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), stat / 2))


def write_eagle3_head(
    folder: Path,
    target: Path,
    *,
    seed: int = 0,
    draft_vocab_size: int | None = None,
    layers: list[int] | None = None,
    init_range: float = 0.3,
) -> Path:
    """A random EAGLE-3 head for the ``target`` checkpoint, in the published layout
    (``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``, ``t2d``; float32 safetensors).

    ``draft_vocab_size``: a seeded random subset of the target ids (None: all of them);
    ``layers``: ``eagle_config.eagle_aux_hidden_state_layer_ids`` (None: every target layer).
    """
    from safetensors.torch import save_file

    config = json.loads((target / "config.json").read_text())
    dim, vocab = config["hidden_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or dim // heads
    inter = config["intermediate_size"]
    layer_ids = layers if layers is not None else list(range(config["num_hidden_layers"]))
    dv = draft_vocab_size or vocab
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * init_range

    def norm() -> torch.Tensor:
        return torch.rand(dim, generator=gen) + 0.5

    keep = torch.sort(torch.randperm(vocab, generator=gen)[:dv]).values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[keep] = True
    tensors = {
        "fc.weight": rand(dim, len(layer_ids) * dim),
        "midlayer.self_attn.q_proj.weight": rand(heads * head_dim, 2 * dim),
        "midlayer.self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * dim),
        "midlayer.self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * dim),
        "midlayer.self_attn.o_proj.weight": rand(dim, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": rand(inter, dim),
        "midlayer.mlp.up_proj.weight": rand(inter, dim),
        "midlayer.mlp.down_proj.weight": rand(dim, inter),
        "midlayer.hidden_norm.weight": norm(),
        "midlayer.input_layernorm.weight": norm(),
        "midlayer.post_attention_layernorm.weight": norm(),
        "norm.weight": norm(),
        "lm_head.weight": rand(dv, dim) * 3,
        "d2t": keep - torch.arange(dv),
        "t2d": t2d,
    }
    head_config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": dim,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "draft_vocab_size": dv,
        "rms_norm_eps": config.get("rms_norm_eps", 1e-6),
        "max_position_embeddings": config.get("max_position_embeddings", 256),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layer_ids},
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(head_config, indent=2), encoding="utf-8")
    return folder


def write_mtp_target(
    folder: Path,
    target: Path,
    *,
    seed: int = 0,
    init_range: float = 0.3,
    shared_copies: bool = True,
) -> Path:
    """A copy of the ``target`` checkpoint with one random MTP module in DeepSeek-V3's layout:
    ``num_nextn_predict_layers: 1`` in config.json, the module as decoder layer
    ``num_hidden_layers`` (``enorm``, ``hnorm``, ``eh_proj``, a decoder layer, ``shared_head``)
    in a second shard, with ``model.safetensors.index.json`` over both (float32).

    ``shared_copies``: also store ``embed_tokens`` and ``shared_head.head`` copies of the
    target's embedding and LM head in the module, as DeepSeek-V3's checkpoint does.
    """
    import shutil

    from safetensors.torch import load_file, save_file

    config = json.loads((target / "config.json").read_text())
    dim, vocab = config["hidden_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or dim // heads
    inter = config["intermediate_size"]
    n = config["num_hidden_layers"]
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * init_range

    def norm() -> torch.Tensor:
        return torch.rand(dim, generator=gen) + 0.5

    folder.mkdir(parents=True, exist_ok=True)
    for item in target.iterdir():
        if item.name not in ("config.json", "model.safetensors"):
            shutil.copy(item, folder / item.name)
    main = load_file(str(target / "model.safetensors"))
    p = f"model.layers.{n}."
    module = {
        p + "enorm.weight": norm(),
        p + "hnorm.weight": norm(),
        p + "eh_proj.weight": rand(dim, 2 * dim),
        p + "input_layernorm.weight": norm(),
        p + "self_attn.q_proj.weight": rand(heads * head_dim, dim),
        p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, dim),
        p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, dim),
        p + "self_attn.o_proj.weight": rand(dim, heads * head_dim),
        p + "post_attention_layernorm.weight": norm(),
        p + "mlp.gate_proj.weight": rand(inter, dim),
        p + "mlp.up_proj.weight": rand(inter, dim),
        p + "mlp.down_proj.weight": rand(dim, inter),
        p + "shared_head.norm.weight": norm(),
    }
    if shared_copies:
        embed = main["model.embed_tokens.weight"]
        module[p + "embed_tokens.weight"] = embed.clone()
        module[p + "shared_head.head.weight"] = main.get("lm_head.weight", embed).clone()
    shards = {"model-00001-of-00002.safetensors": main, "model-00002-of-00002.safetensors": module}
    weight_map = {}
    for name, tensors in shards.items():
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / name))
        weight_map.update(dict.fromkeys(tensors, name))
    total = sum(t.numel() * t.element_size() for s in shards.values() for t in s.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    config["num_nextn_predict_layers"] = 1
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    assert vocab == main["model.embed_tokens.weight"].shape[0]
    return folder
