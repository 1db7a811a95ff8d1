"""The step-cost model's MTP draft step: one forward of the target's real MTP module, read from
its headers (DeepSeek-V3's layer 61, demo-target-mtp's layer 12), not a main layer's average."""

from __future__ import annotations

import pytest

from spectool.ckpt.inspect import inspect_folder
from spectool.ckpt.refs import builtin_path, resolve_checkpoint
from spectool.predict import (
    ENGINE_DEFAULTS,
    forward_cost,
    geometry_from_checkpoint,
    mtp_geometry_from_checkpoint,
    setup_for,
)
from spectool.profiles import load_gpu


def test_demo_target_mtp_module_geometry_is_counted_from_its_tensors() -> None:
    ckpt = resolve_checkpoint("spectool:demo-target-mtp")
    module = mtp_geometry_from_checkpoint(ckpt)
    assert module is not None
    dim, inter, kv = 256, 704, 2 * 64
    layer = 2 * dim * dim + 2 * kv * dim + 3 * dim * inter + 2 * dim  # attention, mlp, 2 norms
    own = 2 * dim * dim + 3 * dim  # eh_proj [256, 512], enorm, hnorm, shared_head.norm
    lm_head = 4096 * dim  # shared_head.head (the tied embedding's copy); embed_tokens left out
    assert module.dense_params == layer + own + lm_head
    assert module.lm_head_params == lm_head and module.num_layers == 1
    target = geometry_from_checkpoint(ckpt)
    assert target.num_layers == 12  # the MTP layer is no part of the target
    assert module.kv_bytes_per_token == target.kv_bytes_per_token / 12
    # the module is eh_proj and two norms larger than a main layer (whose average carries a
    # twelfth of the final norm): the cut-to-one-layer estimate misses them
    cut = target.with_layers(1).dense_params
    assert module.dense_params - cut == pytest.approx(own - dim / 12)
    assert mtp_geometry_from_checkpoint(inspect_folder(builtin_path("demo-target"))) is None


def test_deepseek_v3_mtp_module_is_a_moe_layer_with_eh_proj(make_ckpt) -> None:
    ckpt = inspect_folder(make_ckpt("deepseek-ai/DeepSeek-V3"))
    module = mtp_geometry_from_checkpoint(ckpt)
    target = geometry_from_checkpoint(ckpt)
    assert module is not None
    assert (module.num_experts, module.moe_layers, module.experts_per_token) == (256, 1, 8)
    assert module.expert_params == target.expert_params
    assert module.lm_head_params == 129280 * 7168  # shared_head.head
    assert module.dense_params > 7168 * 14336 + module.lm_head_params  # eh_proj counted
    h200 = load_gpu("h200")
    setup = setup_for(ckpt, "mtp", h200, tp=8)
    assert setup.mtp_layer == module
    f = ENGINE_DEFAULTS["trtllm"]
    step = forward_cost(module, setup.hardware, f, 4, 1, setup.context, 8).seconds
    assert setup.draft_time(4, 3, 2.0, 0.2) == pytest.approx(3 * (step + f.draft_step_overhead_s))
    cut = forward_cost(target.with_layers(1), setup.hardware, f, 4, 1, setup.context, 8).seconds
    assert step != pytest.approx(cut, rel=0.01)
