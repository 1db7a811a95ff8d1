"""The GGUF export in benchmarks/engine_vs_llamacpp.py permutes q/k rows from Hugging Face's
rotate-half rotary layout to GGML's interleaved one: the same rotation must come out."""

from __future__ import annotations

import numpy as np
from bench_support import load_benchmark


def rope_tables(dim: int, pos: int) -> tuple[np.ndarray, np.ndarray]:
    inv = 10000.0 ** (-np.arange(0, dim, 2) / dim)  # [dim/2]
    return np.cos(pos * inv), np.sin(pos * inv)


def rotate_half(x: np.ndarray, pos: int) -> np.ndarray:  # x [heads, dim], HF layout
    cos, sin = rope_tables(x.shape[-1], pos)
    half = x.shape[-1] // 2
    x1, x2 = x[:, :half], x[:, half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rotate_interleaved(x: np.ndarray, pos: int) -> np.ndarray:  # GGML "normal" rope
    cos, sin = rope_tables(x.shape[-1], pos)
    even, odd = x[:, 0::2], x[:, 1::2]
    out = np.empty_like(x)
    out[:, 0::2], out[:, 1::2] = even * cos - odd * sin, odd * cos + even * sin
    return out


def test_permuted_rows_rotate_like_rotate_half() -> None:
    bench = load_benchmark("engine_vs_llamacpp.py")
    heads, dim, hidden = 2, 8, 5
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((heads * dim, hidden))  # HF [out, in]
    x = rng.standard_normal(hidden)
    permuted = bench.permute_rotary(weight, heads)
    half = dim // 2
    for pos in (0, 3, 17):
        hf = rotate_half((weight @ x).reshape(heads, dim), pos)
        gg = rotate_interleaved((permuted @ x).reshape(heads, dim), pos)
        # GGML's pair (2i, 2i+1) is Hugging Face's pair (i, i + dim/2), rotated alike
        np.testing.assert_allclose(gg[:, 0::2], hf[:, :half], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(gg[:, 1::2], hf[:, half:], rtol=1e-12, atol=1e-12)
    # without the permutation the rotations disagree (the test can fail)
    plain = rotate_interleaved((weight @ x).reshape(heads, dim), 3)
    assert not np.allclose(
        plain[:, 0::2], rotate_half((weight @ x).reshape(heads, dim), 3)[:, :half]
    )


def test_permutation_is_a_row_reordering_per_head() -> None:
    bench = load_benchmark("engine_vs_llamacpp.py")
    weight = np.arange(16 * 3).reshape(16, 3).astype(np.float64)
    permuted = bench.permute_rotary(weight, 2)
    # head 0 rows 0..7: rotate-half pairs (0,4),(1,5),(2,6),(3,7) become adjacent
    assert [int(r) for r in permuted[:8, 0] // 3] == [0, 4, 1, 5, 2, 6, 3, 7]
    assert [int(r) for r in permuted[8:, 0] // 3] == [8, 12, 9, 13, 10, 14, 11, 15]
