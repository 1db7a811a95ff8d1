"""The engine's Transformer computes what transformers computes for the same checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: TID253 (engine tests use torch throughout)

from spectool.engine.load import load_model
from spectool.engine.model import (
    PACKED_MAX_ROWS,
    ModelArgs,
    Projection,
    fp16_weight_kernel,
    pack_rows,
)
from spectool.errors import CheckpointError

from .helpers import write_checkpoint

TOL = 1e-4

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # GQA 4:2, llama3 rope scaling whose thresholds put head frequencies in all three bands.
    "llama-gqa-llama3rope-untied": (
        "llama",
        {
            "rope_theta": 10000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "llama-mha-linearrope-tied": (
        "llama",
        {"num_kv_heads": 4, "tie": True, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    ),
    "qwen2-qkvbias-untied": ("qwen2", {}),
    "qwen3-qknorm-headdim16-bias-untied": ("qwen3", {"head_dim": 16, "attention_bias": True}),
    "qwen3-qknorm-tied": ("qwen3", {"head_dim": 8, "tie": True}),
}


def _hf_model(folder: Path, arch: str) -> torch.nn.Module:
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM

    cls = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "qwen3": Qwen3ForCausalLM}[arch]
    return cls.from_pretrained(folder, dtype=torch.float32).eval()


# Float16 checkpoints (read in float32): their projections run on fbgemm's float16-weight kernel.
FLOAT16_CASES = ("llama-gqa-llama3rope-untied", "qwen2-qkvbias-untied", "qwen3-qknorm-tied")
FP16_KERNEL = fp16_weight_kernel() is not None  # x86 with AVX2 (fbgemm); else torch.mm


@pytest.mark.parametrize(
    ("case", "save_dtype"),
    [(case, torch.float32) for case in CASES] + [(case, torch.float16) for case in FLOAT16_CASES],
)
def test_logits_match_transformers(tmp_path: Path, case: str, save_dtype: torch.dtype) -> None:
    arch, kwargs = CASES[case]
    folder = write_checkpoint(
        tmp_path / case, arch, seed=3, init_range=0.2, save_dtype=save_dtype, **kwargs
    )
    hf = _hf_model(folder, arch)
    ours = load_model(folder, max_seq_len=64)
    packed = [m.packed is not None for m in ours.modules() if isinstance(m, Projection)]
    # Packed exactly when float16 holds the weights (and fbgemm is there): all or nothing here.
    assert packed == [save_dtype == torch.float16 and FP16_KERNEL] * len(packed)
    assert ours.args.tie_word_embeddings == kwargs.get("tie", False)
    if ours.args.tie_word_embeddings:
        assert ours.output.weight.data_ptr() == ours.tok_embeddings.weight.data_ptr()
    gen = torch.Generator().manual_seed(0)
    long_ids = torch.randint(0, 64, (1, 40), generator=gen)
    short_ids = torch.randint(0, 64, (1, 23), generator=gen)
    with torch.no_grad():
        ref_long = hf(long_ids).logits[0]  # [40, V]
        ref_short = hf(short_ids).logits[0]  # [23, V]

        # Whole sequence, no cache.
        got = ours(long_ids, torch.arange(40)[None])[0]
        assert (got - ref_long).abs().max() < TOL

        # Through the KV cache, two rows of different lengths in one padded batch: a prefill
        # chunk, then a 5-token chunk, then single tokens, each row at its own positions.
        cache = ours.new_cache(max_batch_size=4, max_seq_len=64)
        slots = torch.tensor([2, 0])
        seqs = [long_ids[0], short_ids[0]]
        refs = [ref_long, ref_short]
        cuts = [(0, 30, 35, 40), (0, 11, 16, 23)]
        for phase in range(3):
            chunks = [(c[phase], c[phase + 1]) for c in cuts]
            width = max(end - start for start, end in chunks)
            tokens = torch.zeros(2, width, dtype=torch.long)
            positions = torch.full((2, width), -1, dtype=torch.long)
            for b, (start, end) in enumerate(chunks):
                tokens[b, : end - start] = seqs[b][start:end]
                positions[b, : end - start] = torch.arange(start, end)
            logits = ours(tokens, positions, cache, slots)
            for b, (start, end) in enumerate(chunks):
                diff = (logits[b, : end - start] - refs[b][start:end]).abs().max()
                assert diff < TOL, (phase, b, float(diff))


def test_one_row_one_token_decode_matches_transformers(target_dir: Path) -> None:
    """Plain decoding (one row, one token a step) skips the attention mask: same logits."""
    hf = _hf_model(target_dir, "llama")
    ours = load_model(target_dir, max_seq_len=32)
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(2))
    slot = torch.tensor([0])
    with torch.no_grad():
        ref = hf(ids).logits[0]  # [12, V]
        cache = ours.new_cache(max_batch_size=1, max_seq_len=32)
        got = [ours(ids[:, :4], torch.arange(4)[None], cache, slot)[0]]
        for t in range(4, 12):
            got.append(ours(ids[:, t : t + 1], torch.tensor([[t]]), cache, slot)[0])
    assert (torch.cat(got) - ref).abs().max() < TOL


def test_fp16_packing_is_lossless_and_batch_invariant() -> None:
    """Packed only when float16 holds every weight; a packed row's product stays within float32
    noise of torch.mm and of itself computed in a batch of another size."""
    gen = torch.Generator().manual_seed(0)
    proj = Projection(96, 160, bias=True)
    with torch.no_grad():
        proj.weight.copy_(torch.randn(96, 160, generator=gen))  # not float16-exact
        proj.bias.copy_(torch.randn(160, generator=gen))
    assert not proj.pack_fp16() and proj.packed is None
    with torch.no_grad():
        proj.weight.copy_(proj.weight.half().float())
        proj.bias.copy_(proj.bias.half().float())
    x = torch.randn(9, 96, generator=gen)
    with torch.no_grad():
        want = torch.addmm(proj.bias, x, proj.weight)
        assert proj.pack_fp16() == FP16_KERNEL
        rows = [proj(x[:m]) for m in range(1, 10)]
    assert (rows[-1] - want).abs().max() < 1e-4
    # fbgemm's small-row kernels block the sum differently per row count on CPUs without
    # AVX-512 (AMD EPYC with AVX2 alone differs by ~1e-5): the same row stays within float32
    # noise whatever the batch, exact where the CPU has AVX-512
    assert all((r - rows[-1][: len(r)]).abs().max() < 1e-4 for r in rows)


def test_packed_projection_leaves_large_calls_to_torch_mm_when_threaded() -> None:
    """fbgemm runs on one thread: with more threads, calls above PACKED_MAX_ROWS use torch.mm."""
    proj = Projection(32, 48, bias=False)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        proj.weight.copy_(torch.randn(32, 48, generator=gen).half().float())
    assert proj.pack_fp16() == FP16_KERNEL
    x = torch.randn(PACKED_MAX_ROWS + 36, 32, generator=gen)
    threads = torch.get_num_threads()
    try:
        with torch.no_grad():
            torch.set_num_threads(2)
            assert torch.equal(proj(x), torch.mm(x, proj.weight))
            torch.set_num_threads(1)
            one_thread = proj(x)
            if FP16_KERNEL:  # one thread: the packed kernel at every size
                packed = torch.fbgemm_linear_fp16_weight(x, proj.packed, torch.zeros(48))
                assert torch.equal(one_thread, packed)
    finally:
        torch.set_num_threads(threads)
    assert (one_thread - torch.mm(x, proj.weight)).abs().max() < 1e-4


def test_pack_rows_pads_at_position_minus_one() -> None:
    tokens, positions = pack_rows([[5, 6, 7], [9]], [10, 3])
    assert tokens.tolist() == [[5, 6, 7], [9, 0, 0]]
    assert positions.tolist() == [[10, 11, 12], [3, -1, -1]]


def test_select_returns_only_requested_steps(target_dir: Path) -> None:
    model = load_model(target_dir, max_seq_len=32)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(9).expand(2, 9)
    with torch.no_grad():
        full = model(ids, positions)
        picked = model(ids, positions, select=torch.tensor([[8], [3]]))
    assert picked.shape == (2, 1, 64)
    # Equal up to float noise: MKL's LM head may round 2 rows and 18 rows differently (seen on
    # AMD EPYC); a wrongly picked step would differ by about 1.
    assert torch.allclose(picked[0, 0], full[0, 8], atol=1e-5, rtol=0)
    assert torch.allclose(picked[1, 0], full[1, 3], atol=1e-5, rtol=0)
    assert not torch.allclose(full[0, 8], full[0, 7], atol=1e-2)


def test_hidden_layers_capture_the_residual_stream(target_dir: Path) -> None:
    """Captured layer outputs equal transformers' hidden states, in the order asked for, and
    the last layer's output through the final norm and LM head gives the logits."""
    model = load_model(target_dir, max_seq_len=32)
    hf = _hf_model(target_dir, "llama")
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(4))
    positions = torch.arange(7).expand(2, 7)
    with torch.no_grad():
        plain = model(ids, positions)
        logits, hidden = model(ids, positions, hidden_layers=(1, 0))
        want = hf(ids, output_hidden_states=True).hidden_states[1]  # after layer 0
    assert torch.equal(logits, plain)
    assert hidden.shape == (2, 7, 2 * 32)
    assert torch.allclose(hidden[..., 32:], want, atol=1e-4, rtol=1e-5)  # entries up to ~100
    last = hidden[..., :32].reshape(14, 32)
    again = model.output.forward(model.norm.forward(last)).view(2, 7, -1)
    assert torch.allclose(again, plain, atol=1e-4, rtol=1e-5)
    with pytest.raises(ValueError, match="distinct layers"):
        model(ids, positions, hidden_layers=(0, 2))


BASE_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 64,
}


def test_model_args_from_transformers4_layout() -> None:
    config = {
        **BASE_CONFIG,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "tie_word_embeddings": True,
    }
    args = ModelArgs.from_hf_config(config)
    assert args.rope_theta == 500000.0
    assert args.rope_scaling.rope_type == "llama3"
    assert args.rope_scaling.factor == 32.0
    assert (args.head_dim, args.n_kv_heads, args.tie_word_embeddings) == (8, 2, True)


def test_qwen2_always_has_qkv_bias_and_no_o_bias() -> None:
    args = ModelArgs.from_hf_config(
        {**BASE_CONFIG, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}
    )
    assert (args.qkv_bias, args.o_bias, args.qk_norm) == (True, False, False)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "unsupported model_type"),
        ({"architectures": ["EagleForCausalLM"]}, "unsupported architectures"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "unsupported rope_type"),
        ({"use_sliding_window": True}, "sliding-window"),
        ({"num_key_value_heads": 3}, "not a multiple"),
        ({"hidden_size": None}, "malformed"),
    ],
)
def test_unsupported_configs_raise_checkpoint_error(change: dict[str, Any], message: str) -> None:
    config = {**BASE_CONFIG, **change}
    with pytest.raises(CheckpointError, match=message):
        ModelArgs.from_hf_config(config, where="config.json")


def test_missing_field_names_it() -> None:
    config = dict(BASE_CONFIG)
    del config["intermediate_size"]
    with pytest.raises(CheckpointError, match="lacks 'intermediate_size'"):
        ModelArgs.from_hf_config(config, where="config.json")
