"""Step cost of parallel layouts (issue 25): links, attention DP's MoE exchange, the pipeline."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spectool import predicted, profiles
from spectool.errors import BadInputError
from spectool.parallel import ParallelLayout
from spectool.predict import ENGINE_DEFAULTS, Hardware, Setup, forward_cost
from spectool.predict import parallel_cost as pc
from spectool.profiles import load_gpu

F = ENGINE_DEFAULTS["trtllm"]
ONE_NODE_TP8 = ParallelLayout(tp=8, gpus_per_node=8)
TP8_PP2_TWO_NODES = ParallelLayout(tp=8, pp=2, nodes=2, gpus_per_node=8)
DSV3_DP = ParallelLayout(tp=8, ep=8, attention_dp=True, gpus_per_node=8)


def _pair(name: str):  # noqa: ANN202 - predicted.PairGeometry
    record = profiles.load_profile(name)
    return record, predicted.pair_geometry(None, None, record.method, record, name)


@pytest.fixture(scope="module")
def h100() -> Hardware:
    return Hardware.from_gpu(load_gpu("h100-sxm"), "h100-sxm")


@pytest.fixture(scope="module")
def l405():  # noqa: ANN201
    return _pair("llama-3.1-405b-eagle3")[1]


@pytest.fixture(scope="module")
def dsv3():  # noqa: ANN201
    return _pair("deepseek-v3-mtp")[1]


def _setup(pair, hw: Hardware, layout: ParallelLayout | None, method: str, tp: int = 8) -> Setup:  # noqa: ANN001
    return Setup(
        target=pair.target,
        method=method,
        hardware=hw,
        factors=F,
        drafter=pair.drafter,
        mtp_layer=pair.mtp_layer,
        tp=layout.tp if layout else tp,
        layout=layout,
    )


def test_a_tp_only_layout_costs_what_plain_tp_costs(l405, h100) -> None:
    plain = _setup(l405, h100, None, "eagle3")
    laid = _setup(l405, h100, ONE_NODE_TP8, "eagle3")
    for c in (1, 8, 64):
        assert laid.base_step(c) == pytest.approx(plain.base_step(c), rel=1e-12)
        assert laid.spec_step(c, 3, 2.5, 0.2) == pytest.approx(
            plain.spec_step(c, 3, 2.5, 0.2), rel=1e-12
        )


def test_pp_at_batch_1_is_the_sum_of_its_stages_plus_the_sends(l405, h100) -> None:
    tp_only = _setup(l405, h100, ONE_NODE_TP8, "eagle3")
    pp = _setup(l405, h100, TP8_PP2_TWO_NODES, "eagle3")
    send = pc.send_s(h100, F, 1, l405.target.hidden_size, internode=True)
    # the same weights per step on each GPU's path; PP adds a forward launch and the send
    extra = pp.base_step(1) - tp_only.base_step(1)
    assert extra == pytest.approx(send + F.forward_overhead_s, rel=1e-6)
    assert pp.spec_step(1, 3, 2.5, 0.2) > tp_only.spec_step(1, 3, 2.5, 0.2)


def test_pp_overlaps_micro_batches(l405, h100) -> None:
    pp = _setup(l405, h100, TP8_PP2_TWO_NODES, "eagle3")
    stages = pc.stage_seconds(l405.target, h100, F, 32, 1, pp.context, TP8_PP2_TWO_NODES)
    stages[-1] += F.step_overhead_s
    # 64 requests in 2 micro-batches of 32: both stages busy, the slowest paced twice
    assert pp.base_step(64) == pytest.approx(2 * max(stages), rel=1e-9)
    assert pp.base_step(64) < pp.target_step(64, 1)  # cheaper than one batch of 64 in turn


def test_a_two_node_pipeline_sends_over_the_network(l405, h100) -> None:
    assert pc.boundary_spans_nodes(TP8_PP2_TWO_NODES, 0)
    assert not pc.tp_spans_nodes(TP8_PP2_TWO_NODES)
    one_node = ParallelLayout(tp=8, pp=2, nodes=1, gpus_per_node=16)
    assert not pc.boundary_spans_nodes(one_node, 0)
    slow_net = replace(h100, internode_bandwidth=1e9)
    for layout, moves in ((TP8_PP2_TWO_NODES, True), (one_node, False)):
        fast = _setup(l405, h100, layout, "eagle3").base_step(64)
        slow = _setup(l405, slow_net, layout, "eagle3").base_step(64)
        assert (slow > fast) is moves


def test_tp_across_nodes_all_reduces_over_the_network(l405, h100) -> None:
    tp16 = ParallelLayout(tp=16, nodes=2, gpus_per_node=8)
    assert pc.tp_spans_nodes(tp16)
    net = pc.tp_hardware(h100, tp16)
    assert net.link_bandwidth == h100.internode_bandwidth == 50e9
    assert pc.tp_hardware(h100, ONE_NODE_TP8).link_bandwidth == 450e9
    assert _setup(l405, h100, tp16, "eagle3").base_step(8) > _setup(
        l405, h100, None, "eagle3", tp=16
    ).base_step(8)


def test_ep_with_attention_dp_reads_one_eighth_of_the_experts(dsv3, h100) -> None:
    geom = dsv3.target
    single = forward_cost(geom, h100, F, 8, 1, 1024, 1)
    dp = pc.rank_forward(geom, h100, F, 8, 1, 1024, DSV3_DP)  # one sequence per rank
    bpp = geom.weight_bytes_per_param
    single_experts = single.weight_bytes - geom.dense_params * bpp
    assert dp.parts["expert_bytes"] == pytest.approx(single_experts / 8, rel=1e-9)
    assert dp.parts["dense_bytes"] == pytest.approx(geom.dense_params * bpp)  # replicated
    assert dp.kv_bytes == pytest.approx(single.kv_bytes / 8)  # its own sequence's cache


def test_the_moe_exchange_grows_with_the_verify_width(dsv3, h100) -> None:
    geom = dsv3.target
    costs = [pc.rank_forward(geom, h100, F, 8, k + 1, 1024, DSV3_DP).allreduce_s for k in range(5)]
    assert all(b > a for a, b in zip(costs, costs[1:], strict=False))
    per_token = 2 * geom.moe_layers * 7 / 8 * 8 * geom.hidden_size * 2 / (450e9 * F.link_fraction)
    assert costs[3] - costs[0] == pytest.approx(3 * per_token, rel=1e-9)
    # DeepSeek-V3's first 3 layers are dense: a stage of them exchanges nothing
    first = pc.stage_geometry(geom, range(3), last=False)
    assert first.moe_layers == 0 and first.lm_head_params == 0
    assert pc.rank_forward(first, h100, F, 8, 1, 1024, DSV3_DP).allreduce_s == 0.0
    assert pc.stage_geometry(geom, range(3, 61), last=True).moe_layers == 58


def test_attention_dp_pads_idle_ranks_and_mtp_pays_its_exchange(dsv3, h100) -> None:
    dp = _setup(dsv3, h100, DSV3_DP, "mtp")
    assert dp.base_step(1) == dp.base_step(8)  # one (dummy) request on every rank either way
    assert dp.base_step(64) > dp.base_step(8)
    layer = dsv3.mtp_layer or dsv3.target.with_layers(1)
    draft = dp.draft_time(8, 3, 2.5, 0.2)
    one = pc.rank_forward(layer, h100, F, 8, 1, dp.context, DSV3_DP)
    assert one.allreduce_s > 0 and draft == pytest.approx(
        3 * (one.seconds + F.draft_step_overhead_s)
    )


def test_pp_refuses_a_separate_drafter(l405, h100) -> None:
    with pytest.raises(BadInputError, match="no draft_model drafter with PP 2"):
        _setup(l405, h100, TP8_PP2_TWO_NODES, "draft_model")
    with pytest.raises(BadInputError, match="tp 4 differs"):
        Setup(l405.target, "eagle3", h100, F, drafter=l405.drafter, tp=4, layout=ONE_NODE_TP8)
