"""The step-cost model: geometry, acceptance, roofline, speed-up, break-even, speed."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from spectool.ckpt.inspect import inspect_folder
from spectool.ckpt.refs import builtin_path
from spectool.errors import BadInputError
from spectool.predict import (
    ENGINE_DEFAULTS,
    Acceptance,
    Hardware,
    Setup,
    forward_cost,
    geometry_from_checkpoint,
    geometry_from_mapping,
    predict,
    speedup,
)
from spectool.profiles import load_gpu

LLAMA_8B = {
    "num_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "head_dim": 128,
    "num_kv_heads": 8,
    "dense_params": 7.5e9,
    "lm_head_params": 5.25e8,
    "weight_dtype": "bf16",
}
EAGLE3_HEAD = {
    "num_layers": 1,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "head_dim": 128,
    "num_kv_heads": 8,
    "dense_params": 3.0e8,
    "lm_head_params": 1.3e8,
    "weight_dtype": "bf16",
}


@pytest.fixture(scope="module")
def h100() -> Hardware:
    return Hardware.from_gpu(load_gpu("h100-sxm"), "h100-sxm")


@pytest.fixture(scope="module")
def eagle_setup(h100: Hardware) -> Setup:
    return Setup(
        target=geometry_from_mapping(LLAMA_8B, "llama-8b"),
        drafter=geometry_from_mapping(EAGLE3_HEAD, "eagle3"),
        method="eagle3",
        hardware=h100,
        factors=ENGINE_DEFAULTS["trtllm"],
        context=1024,
    )


def test_demo_geometry_from_headers() -> None:
    geom = geometry_from_checkpoint(inspect_folder(builtin_path("demo-target")))
    assert geom.num_layers == 12 and geom.hidden_size == 256
    # 12 x (q 256x256 + k,v 256x128 + o 256x256 + MLP 3 x 256x704 + 2 norms) + final norm
    # + the tied LM head 4096 x 256
    per_layer = 256 * 256 * 2 + 256 * 128 * 2 + 3 * 256 * 704 + 2 * 256
    assert geom.dense_params == 12 * per_layer + 256 + 4096 * 256
    assert geom.lm_head_params == 4096 * 256
    assert geom.weight_bytes_per_param == 2.0  # float16
    assert geom.kv_bytes_per_token == 2 * 12 * 2 * 64 * 2


def test_geometry_mapping_errors_name_the_field() -> None:
    bad = {**LLAMA_8B, "num_layers": 0}
    with pytest.raises(BadInputError, match=r"profiles/x.yaml: invalid geometry: num_layers"):
        geometry_from_mapping(bad, "x", where="profiles/x.yaml")
    no_kv = {k: v for k, v in LLAMA_8B.items() if k != "num_kv_heads"}
    with pytest.raises(BadInputError, match="kv_bytes_per_token or num_kv_heads"):
        geometry_from_mapping(no_kv, "x")
    half_moe = {**LLAMA_8B, "num_experts": 8}
    with pytest.raises(BadInputError, match="MoE needs"):
        geometry_from_mapping(half_moe, "x")


def test_moe_distinct_experts() -> None:
    moe = geometry_from_mapping(
        {
            **LLAMA_8B,
            "num_experts": 128,
            "experts_per_token": 8,
            "moe_layers": 32,
            "expert_params": 4.7e6,
        },
        "moe",
    )
    assert moe.distinct_experts(1) == pytest.approx(8)
    assert moe.distinct_experts(2) == pytest.approx(128 * (1 - (120 / 128) ** 2))
    assert moe.distinct_experts(10_000) == pytest.approx(128)
    # more tokens touch more experts: a verify step of 4 tokens reads more weights than 1
    one = forward_cost(moe, Hardware("x", 1e12, 1e15), ENGINE_DEFAULTS["trtllm"], 1, 1, 0)
    four = forward_cost(moe, Hardware("x", 1e12, 1e15), ENGINE_DEFAULTS["trtllm"], 1, 4, 0)
    assert four.weight_bytes > 3 * one.weight_bytes - 2 * moe.dense_params * 2


def test_roofline_memory_bound_at_batch_1_compute_bound_large(h100: Hardware) -> None:
    geom = geometry_from_mapping(LLAMA_8B, "llama-8b")
    f = ENGINE_DEFAULTS["trtllm"]
    small = forward_cost(geom, h100, f, 1, 1, 1024)
    assert small.bound == "memory"
    # 16 GB of bf16 weights at the engine's achieved share of 3.35 TB/s: about 5 ms
    assert small.memory_s == pytest.approx(
        (7.5e9 * 2 + 1024 * 2 * 32 * 8 * 128 * 2) / (3.35e12 * f.bw_fraction)
    )
    big = forward_cost(geom, h100, f, 512, 8, 1024)
    assert big.bound == "compute"
    tp2 = forward_cost(geom, h100, f, 1, 1, 1024, tp=2)
    assert tp2.allreduce_s > 0 and tp2.memory_s == pytest.approx(small.memory_s / 2)


def test_acceptance_forms() -> None:
    acc = Acceptance.from_alphas([0.8, 0.5], "test")
    assert acc.tokens_per_step(0) == 1.0
    assert acc.tokens_per_step(2) == pytest.approx(1 + 0.8 + 0.4)
    assert acc.tokens_per_step(3) is None  # beyond what was measured
    assert acc.all_accepted(2) == pytest.approx(0.4)
    const = Acceptance.from_length(2.5, 3, "published")
    assert const.tokens_per_step(3) == pytest.approx(2.5, abs=1e-6)
    assert const.tokens_per_step(8) > 2.5  # constant alpha extrapolates
    with pytest.raises(BadInputError, match="outside"):
        Acceptance.from_length(5.0, 3, "published")


def test_speedup_formula_by_hand(eagle_setup: Setup) -> None:
    acc = Acceptance.from_rate(0.7, "rate")
    k = 3
    tokens = 1 + 0.7 + 0.49 + 0.343
    base = eagle_setup.base_step(1)
    spec = (
        eagle_setup.draft_time(1, k, tokens, 0.343)
        + eagle_setup.target_step(1, k + 1)
        + eagle_setup.coord_time(1)
    )
    assert speedup(eagle_setup, acc, 1, k) == pytest.approx(base * tokens / spec)
    assert 1.5 < speedup(eagle_setup, acc, 1, k) < tokens


def test_speedup_falls_with_concurrency_and_break_even(eagle_setup: Setup) -> None:
    acc = Acceptance.from_rate(0.7, "rate")
    # short contexts: large batches turn compute-bound (long ones stay bound by KV reads)
    eagle_setup = replace(eagle_setup, context=256)
    pred = predict(eagle_setup, acc, concurrencies=(1, 8, 64, 1024))
    best = [row.best for row in pred.rows]
    assert all(b is not None for b in best)
    speeds = [b.speedup for b in best if b is not None]
    # flat while memory-bound (a few sequences cost what one does), then falling
    assert speeds[0] == pytest.approx(speeds[1], rel=0.05)
    assert speeds[1] > speeds[2] > speeds[3]
    assert speeds[0] > 1.5 and speeds[-1] < 1.0
    # the break-even concurrency sits between the last paying and the first losing row
    assert pred.break_even_concurrency is not None
    assert 64 < pred.break_even_concurrency <= 1024
    # break-even acceptance length: at it, the speed-up is 1
    row = pred.at(8)
    for p in row.ks:
        length = p.break_even_length
        if length < p.k + 1:
            const = Acceptance.from_length(length, p.k, "be")
            assert speedup(eagle_setup, const, 8, p.k) == pytest.approx(1.0, abs=1e-3)


def test_without_acceptance_only_break_even(eagle_setup: Setup) -> None:
    pred = predict(eagle_setup, None, concurrencies=(1, 8))
    assert pred.break_even_concurrency is None
    for row in pred.rows:
        assert row.best is None
        assert all(p.speedup is None and p.break_even_length > 1.0 for p in row.ks)
        # longer drafts need more accepted tokens to pay
        lengths = [p.break_even_length for p in row.ks]
        assert lengths == sorted(lengths)


def test_measured_positions_limit_k(eagle_setup: Setup) -> None:
    acc = Acceptance.from_alphas([0.9, 0.8, 0.7], "tune")
    pred = predict(eagle_setup, acc, concurrencies=(1,), ks=range(1, 6))
    row = pred.at(1)
    assert [p.speedup is not None for p in row.ks] == [True, True, True, False, False]
    with pytest.raises(BadInputError, match="up to k=3"):
        speedup(eagle_setup, acc, 1, 4)


def test_methods_draft_costs(h100: Hardware) -> None:
    target = geometry_from_mapping(LLAMA_8B, "llama-8b")
    f = ENGINE_DEFAULTS["trtllm"]
    ngram = Setup(target=target, method="ngram", hardware=h100, factors=f)
    mtp = Setup(target=target, method="mtp", hardware=h100, factors=f)
    assert ngram.draft_time(4, 3, 2.0, 0.2) == 0.0
    one_layer = forward_cost(target.with_layers(1), h100, f, 4, 1, 1024).seconds
    # k forwards of the MTP layer, each with the engine's per-draft-step overhead
    assert f.draft_step_overhead_s > 0
    assert mtp.draft_time(4, 3, 2.0, 0.2) == pytest.approx(
        3 * (one_layer + f.draft_step_overhead_s)
    )
    free = Setup(target=target, method="mtp", hardware=h100, factors=f.but(draft_step_overhead_s=0))
    assert free.draft_time(4, 3, 2.0, 0.2) == pytest.approx(3 * one_layer)
    # a drafter or head: k forwards (the first over the confirmed tokens) + k step overheads
    head = target.with_layers(1, name="head")
    eagle = Setup(target=target, method="eagle3", hardware=h100, factors=f, drafter=head)
    first = forward_cost(head, h100, f, 4, 2.0, 1024).seconds
    one = forward_cost(head, h100, f, 4, 1, 1024).seconds
    expected = first + 2 * one + 3 * f.draft_step_overhead_s
    assert eagle.draft_time(4, 3, 2.0, 0.2) == pytest.approx(expected)
    with pytest.raises(BadInputError, match="needs the drafter"):
        Setup(target=target, method="draft_model", hardware=h100, factors=f)


def test_predict_is_fast(eagle_setup: Setup) -> None:
    acc = Acceptance.from_rate(0.7, "rate")
    t0 = time.perf_counter()
    predict(eagle_setup, acc, concurrencies=(1, 8, 64), ks=range(1, 9))
    # done-when 4: well under 100 ms of pure Python (generous here: CI machines are shared)
    assert time.perf_counter() - t0 < 0.1


def test_a_latent_kv_cache_is_read_whole_on_every_tp_rank(h100: Hardware) -> None:
    mla = geometry_from_mapping({**LLAMA_8B, "kv_bytes_per_token": 35136, "kv_latent": True}, "m")
    gqa = geometry_from_mapping(LLAMA_8B, "g")
    f = ENGINE_DEFAULTS["trtllm"]
    assert forward_cost(mla, h100, f, 4, 1, 1024, 8).kv_bytes == 4 * 1024 * 35136
    assert forward_cost(gqa, h100, f, 4, 1, 1024, 8).kv_bytes == pytest.approx(
        forward_cost(gqa, h100, f, 4, 1, 1024, 1).kv_bytes / 8
    )
