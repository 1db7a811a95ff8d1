import pytest

from spectool.errors import BadInputError
from spectool.parallel import ParallelLayout, validate_layout

# DeepSeek-V3 (config.json): 128 heads, 61 layers, 256 routed experts.
DSV3 = {"heads": 128, "layers": 61, "experts": 256}
# Llama-3.1-405B (config.json): 128 heads, 126 layers, dense.
L405 = {"heads": 128, "layers": 126}


def test_deepseek_ep8_attention_dp_on_8_gpus():
    layout = ParallelLayout(tp=8, ep=8, attention_dp=True, nodes=1, gpus_per_node=8)
    validate_layout(layout, **DSV3)
    assert layout.llm_api_fields() == {
        "tensor_parallel_size": 8,
        "pipeline_parallel_size": 1,
        "moe_expert_parallel_size": 8,
        "enable_attention_dp": True,
    }


def test_llama405b_tp8_pp2_on_two_nodes():
    layout = ParallelLayout(tp=8, pp=2, nodes=2, gpus_per_node=8)
    validate_layout(layout, **L405)
    assert layout.world_size == 16
    assert layout.llm_api_fields()["pipeline_parallel_size"] == 2
    flags = layout.serve_flags()
    assert flags[flags.index("--pp_size") + 1] == "2"
    assert flags[flags.index("--gpus_per_node") + 1] == "8"


@pytest.mark.parametrize(
    ("layout", "model", "flag", "words"),
    [
        (ParallelLayout(tp=8, pp=2, nodes=1, gpus_per_node=8), L405, "--tp/--pp/--ep", "16 ranks"),
        (ParallelLayout(tp=8, ep=3, gpus_per_node=8), DSV3, "--ep", "must divide TP 8"),
        (
            ParallelLayout(tp=2, pp=4, gpus_per_node=8),
            {"heads": 8, "layers": 2},
            "--pp",
            "2 layers",
        ),
        (
            ParallelLayout(tp=6, gpus_per_node=6),
            {"heads": 64, "layers": 80},
            "--tp",
            "64 attention heads",
        ),
        (ParallelLayout(tp=8, ep=8, gpus_per_node=8), L405, "--ep", "dense"),
        (ParallelLayout(tp=8, attention_dp=True, gpus_per_node=8), L405, "--attention-dp", "dense"),
        (
            ParallelLayout(tp=8, ep=8, gpus_per_node=8),
            {"heads": 8, "layers": 4, "experts": 12},
            "--ep",
            "12 experts",
        ),
        (ParallelLayout(tp=1, pp=0, gpus_per_node=1), L405, "--pp", "1 or more"),
    ],
)
def test_bad_layouts_name_the_flag(layout, model, flag, words):
    with pytest.raises(BadInputError) as err:
        validate_layout(layout, **model)
    assert str(err.value).startswith(flag)
    assert words in str(err.value)
