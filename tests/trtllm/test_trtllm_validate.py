"""Built-in validation of --config options: unknown keys, types, Literals and release rules.

All tests run the built-in tables (``use_installed=False``): TensorRT-LLM is not installed here.
"""

from __future__ import annotations

import pytest

from spectool.errors import ConfigError
from spectool.trtllm.validate import validate_options


def ok(options, release="1.2", backend="pytorch"):
    validate_options(options, release, backend, use_installed=False)


def bad(options, path, release="1.2", backend="pytorch", match=None):
    with pytest.raises(ConfigError) as info:
        validate_options(options, release, backend, use_installed=False)
    assert info.value.where == path, str(info.value)
    assert str(info.value).startswith(f"{path}: ")
    if match:
        assert match in info.value.problem, info.value.problem
    return info.value


EAGLE3_12 = {
    "decoding_type": "Eagle3",
    "max_draft_len": 4,
    "speculative_model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
}


def test_documented_examples_pass():
    ok(
        {
            "speculative_config": EAGLE3_12,
            "enable_iter_perf_stats": True,
            "kv_cache_config": {"free_gpu_memory_fraction": 0.8, "enable_block_reuse": False},
            "cuda_graph_config": {"batch_sizes": [1, 2, 4, 8], "enable_padding": True},
            "max_batch_size": 8,
            "disable_overlap_scheduler": True,
        }
    )
    ok({"speculative_config": {"decoding_type": "MTP", "num_nextn_predict_layers": 3}})
    ok({"speculative_config": {"decoding_type": "NGram", "max_draft_len": 4}}, "main")


def test_unknown_top_level_key():
    err = bad({"enable_iter_perf_stat": True}, "enable_iter_perf_stat")
    assert "did you mean enable_iter_perf_stats" in err.problem


def test_unknown_nested_key():
    bad(
        {"kv_cache_config": {"free_gpu_mem_fraction": 0.9}}, "kv_cache_config.free_gpu_mem_fraction"
    )


def test_unknown_speculative_key():
    spec = dict(EAGLE3_12, num_draft_tokens=4)
    bad(
        {"speculative_config": spec},
        "speculative_config.num_draft_tokens",
        match="Eagle3DecodingConfig",
    )


def test_wrong_types():
    bad({"max_batch_size": "64"}, "max_batch_size", match="integer")
    bad({"max_batch_size": True}, "max_batch_size", match="integer")
    bad({"enable_iter_perf_stats": "yes"}, "enable_iter_perf_stats", match="true or false")
    bad(
        {"kv_cache_config": {"free_gpu_memory_fraction": "0.9"}},
        "kv_cache_config.free_gpu_memory_fraction",
    )
    bad({"kv_cache_config": []}, "kv_cache_config", match="mapping")
    bad({"cuda_graph_config": {"batch_sizes": [1, "2"]}}, "cuda_graph_config.batch_sizes[1]")
    spec = dict(EAGLE3_12, max_draft_len=-1)
    bad({"speculative_config": spec}, "speculative_config.max_draft_len", match=">= 0")


def test_float_accepts_integers_but_not_bools():
    ok({"kv_cache_config": {"free_gpu_memory_fraction": 1}})
    bad(
        {"kv_cache_config": {"free_gpu_memory_fraction": False}},
        "kv_cache_config.free_gpu_memory_fraction",
    )


def test_bad_literals():
    spec = dict(EAGLE3_12, eagle3_model_arch="llama4")
    bad({"speculative_config": spec}, "speculative_config.eagle3_model_arch", match="'llama3'")
    bad({"backend": "tensorrt"}, "backend", match="'pytorch'")
    bad({"guided_decoding_backend": "outlines"}, "guided_decoding_backend", match="xgrammar")


def test_string_enums():
    ok({"scheduler_config": {"capacity_scheduler_policy": "MAX_UTILIZATION"}})
    bad(
        {"scheduler_config": {"capacity_scheduler_policy": "FAST"}},
        "scheduler_config.capacity_scheduler_policy",
        match="GUARANTEED_NO_EVICT",
    )


def test_decoding_type_spellings():
    bad(
        {"speculative_config": dict(EAGLE3_12, decoding_type="Eagle-3")},
        "speculative_config.decoding_type",
        match="accepted:",
    )
    dt = {"decoding_type": "DraftTarget", "max_draft_len": 4, "speculative_model_dir": "/m"}
    ok({"speculative_config": dt}, "1.0")
    # 1.2's discriminated union matches the literal Draft_Target only (issue 15, point 4)
    bad({"speculative_config": dt}, "speculative_config.decoding_type", "1.2", match="literal")
    ok({"speculative_config": dict(dt, decoding_type="Draft_Target")}, "1.2")
    ok({"speculative_config": dt}, "main")  # main records the documented alias
    ok({"speculative_config": dict(dt, decoding_type="Draft_Target")}, "main")
    bad(
        {"speculative_config": dict(dt, decoding_type="Draft_Target")},
        "speculative_config.decoding_type",
        "1.0",
    )
    bad(
        {"speculative_config": dict(EAGLE3_12, speculative_model_dir="/m")},
        "speculative_config.speculative_model_dir",
        "1.2",
        match="same field",
    )
    bad(
        {"speculative_config": {"max_draft_len": 4}},
        "speculative_config.decoding_type",
        match="required",
    )


def test_renamed_fields_are_refused_in_the_wrong_release():
    bad(
        {
            "speculative_config": {
                "decoding_type": "Eagle",
                "max_draft_len": 4,
                "speculative_model": "/m",
            }
        },
        "speculative_config.speculative_model",
        "1.0",
    )
    ok(
        {
            "speculative_config": {
                "decoding_type": "Eagle",
                "max_draft_len": 4,
                "pytorch_weights_path": "/m",
            }
        },
        "0.21",
    )
    gate = {"acceptance_window": 8, "acceptance_length_threshold": 1.5}
    ok({"speculative_config": dict(EAGLE3_12, **gate)}, "1.2")
    bad(
        {"speculative_config": dict(EAGLE3_12, **gate)},
        "speculative_config.acceptance_window",
        "main",
    )
    bad({"cuda_graph_config": {"batch_sizes": [1]}}, "cuda_graph_config", "0.21")
    bad(
        {"speculative_config": dict(EAGLE3_12, max_concurrency=4)},
        "speculative_config.decoding_type",
        "1.0",
    )  # no Eagle3 in 1.0 at all


def test_backend_rules():
    ngram = {"decoding_type": "NGram", "max_draft_len": 4}
    bad(
        {"speculative_config": ngram},
        "speculative_config.decoding_type",
        "1.2",
        "tensorrt",
        match="pytorch",
    )
    bad({"speculative_config": EAGLE3_12}, "speculative_config.decoding_type", "1.2", "tensorrt")
    ok({"speculative_config": {"decoding_type": "Medusa", "max_draft_len": 63}}, "1.2", "tensorrt")
    bad(
        {"speculative_config": {"decoding_type": "Medusa", "max_draft_len": 63}},
        "speculative_config.decoding_type",
        "1.2",
        "pytorch",
    )
    bad({"enable_iter_perf_stats": True}, "enable_iter_perf_stats", "1.2", "tensorrt")
    with pytest.raises(ConfigError, match="removed"):
        validate_options({}, "main", "tensorrt", use_installed=False)


def test_drafter_and_depth_rules():
    bad(
        {"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 4}},
        "speculative_config.speculative_model",
        match="draft model",
    )
    bad(
        {"speculative_config": dict(EAGLE3_12, max_draft_len=0)},
        "speculative_config.max_draft_len",
        match="> 0",
    )
    bad(
        {
            "speculative_config": {
                "decoding_type": "Eagle",
                "max_draft_len": 4,
                "speculative_model": "/m",
            }
        },
        "speculative_config.pytorch_weights_path",
        "0.21",
    )
    bad(
        {"speculative_config": {"decoding_type": "NGram", "prompt_lookup_num_tokens": 0}},
        "speculative_config.prompt_lookup_num_tokens",
        "0.21",
    )


def test_schedule_rules_1_2():
    ok({"speculative_config": dict(EAGLE3_12, draft_len_schedule={1: 4, 4: 2, 8: 0})})
    bad(
        {"speculative_config": dict(EAGLE3_12, draft_len_schedule={2: 4, 8: 0})},
        "speculative_config.draft_len_schedule",
        match="batch size 1",
    )
    bad(
        {"speculative_config": dict(EAGLE3_12, draft_len_schedule={1: 3, 8: 0})},
        "speculative_config.draft_len_schedule.1",
        match="max_draft_len (4)",
    )
    bad(
        {"speculative_config": dict(EAGLE3_12, draft_len_schedule={1: 4, 4: 6})},
        "speculative_config.draft_len_schedule.4",
        match="exceeds",
    )
    bad(
        {"speculative_config": dict(EAGLE3_12, draft_len_schedule={"1": 4})},
        "speculative_config.draft_len_schedule['1']",
    )


def test_schedule_rules_main():
    main_spec = dict(EAGLE3_12)
    ok({"speculative_config": dict(main_spec, draft_len_schedule={4: 4, 8: 2})}, "main")
    bad(
        {"speculative_config": dict(main_spec, draft_len_schedule={4: 2, 8: 4})},
        "speculative_config.draft_len_schedule.4",
        "main",
    )
    bad(
        {"speculative_config": dict(main_spec, draft_len_schedule={4: 4}, max_concurrency=4)},
        "speculative_config.draft_len_schedule",
        "main",
        match="exclusive",
    )
    bad(
        {"speculative_config": dict(main_spec, max_concurrency=0)},
        "speculative_config.max_concurrency",
        "main",
    )
    ok({"speculative_config": dict(main_spec, max_concurrency=0)}, "1.2")  # NonNegativeInt there


def test_cuda_graph_union_and_consistency_main():
    ok({"cuda_graph_config": {"batch_sizes": [1, 2], "mode": "decode"}}, "main")
    ok({"cuda_graph_config": {"batch_sizes": [1, 2]}}, "main")
    bad(
        {"cuda_graph_config": {"batch_sizes": [1, 2], "mode": "prefill"}},
        "cuda_graph_config.mode",
        "main",
        match="'decode'",
    )
    bad(
        {"cuda_graph_config": {"batch_sizes": [1, 2, 4], "max_batch_size": 8}},
        "cuda_graph_config.max_batch_size",
        "main",
        match="max(batch_sizes)",
    )


def test_required_nested_field():
    bad(
        {"kv_connector_config": {"connector_module": "m", "connector_scheduler_class": "S"}},
        "kv_connector_config.connector_worker_class",
        "1.2",
        match="required",
    )


def test_root_must_be_a_mapping():
    with pytest.raises(ConfigError, match="mapping"):
        validate_options([1, 2], "1.2", "pytorch", use_installed=False)
