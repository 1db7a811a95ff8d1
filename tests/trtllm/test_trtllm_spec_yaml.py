"""speculative.yaml rendering: every method x release x backend renders and round-trips, or is
refused; golden files pin the documented examples; schedules translate per release."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from spectool.errors import BadInputError, ConfigError
from spectool.findings import Severity
from spectool.trtllm.releases import BACKENDS, METHODS, RELEASES, release_info
from spectool.trtllm.spec_yaml import (
    ServeLimits,
    measuring_yaml,
    read_options_yaml,
    render_baseline_yaml,
    render_speculative_yaml,
    schedule_to_upper_bounds,
)
from spectool.trtllm.support import support_findings
from spectool.trtllm.validate import validate_options

GOLDEN = Path(__file__).parent / "golden"
LIMITS = ServeLimits(free_gpu_memory_fraction=0.85, max_batch_size=64, max_num_tokens=8192)
EAGLE3_LLAMA = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
DRAFTERS = {
    "eagle3": EAGLE3_LLAMA,
    "eagle": "yuhuili/EAGLE-LLaMA3-Instruct-8B",
    "draft_model": "meta-llama/Llama-3.2-1B-Instruct",
    "mtp": None,
    "ngram": None,
    "medusa": None,
}

# name -> (method, release, backend, drafter_ref, max_draft_len, extra keyword arguments)
GOLDEN_CASES = {
    "eagle3_llama31_8b_main": ("eagle3", "main", "pytorch", EAGLE3_LLAMA, 4, {}),
    "eagle3_llama31_8b_1.2": ("eagle3", "1.2", "pytorch", EAGLE3_LLAMA, 4, {}),
    "eagle3_llama31_8b_1.0": ("eagle3", "1.0", "pytorch", EAGLE3_LLAMA, 4, {}),
    "eagle3_llama31_8b_0.21": ("eagle3", "0.21", "pytorch", EAGLE3_LLAMA, 4, {}),
    "mtp_deepseek_v3_main": ("mtp", "main", "pytorch", None, 3, {}),
    "mtp_deepseek_v3_1.2": ("mtp", "1.2", "pytorch", None, 3, {}),
    "draft_target_main": ("draft_model", "main", "pytorch", DRAFTERS["draft_model"], 4, {}),
    "draft_target_1.1": ("draft_model", "1.1", "pytorch", DRAFTERS["draft_model"], 4, {}),
    "ngram_main": ("ngram", "main", "pytorch", None, 4, {}),
    "eagle3_schedule_1.2": (
        "eagle3",
        "1.2",
        "pytorch",
        EAGLE3_LLAMA,
        4,
        {"draft_len_schedule": {1: 4, 4: 2, 8: 0}, "two_model": True},
    ),
    "eagle3_schedule_main": (
        "eagle3",
        "main",
        "pytorch",
        EAGLE3_LLAMA,
        4,
        {"draft_len_schedule": {1: 4, 4: 2, 8: 0}},
    ),
    "medusa_1.2_tensorrt": (
        "medusa",
        "1.2",
        "tensorrt",
        "FasterDecoding/medusa-vicuna-7b-v1.3",
        4,
        {},
    ),
}


def _render(name):
    method, release, backend, drafter, depth, kwargs = GOLDEN_CASES[name]
    return render_speculative_yaml(
        method, release, backend, drafter_ref=drafter, max_draft_len=depth, limits=LIMITS, **kwargs
    )


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden(name):
    text = _render(name)
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("SPECTOOL_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text()


def test_golden_spellings():
    spec = {
        n: yaml.safe_load((GOLDEN / f"{n}.yaml").read_text())["speculative_config"]
        for n in GOLDEN_CASES
    }
    assert spec["eagle3_llama31_8b_main"]["decoding_type"] == "Eagle3"
    assert spec["eagle3_llama31_8b_main"]["speculative_model"] == EAGLE3_LLAMA
    assert spec["eagle3_llama31_8b_1.2"]["speculative_model_dir"] == EAGLE3_LLAMA
    assert spec["eagle3_llama31_8b_1.0"]["decoding_type"] == "Eagle"
    assert spec["eagle3_llama31_8b_0.21"]["pytorch_weights_path"] == EAGLE3_LLAMA
    assert spec["draft_target_main"]["decoding_type"] == "Draft_Target"
    assert spec["draft_target_1.1"]["decoding_type"] == "DraftTarget"
    assert spec["mtp_deepseek_v3_1.2"]["num_nextn_predict_layers"] == 3
    assert "num_nextn_predict_layers" not in spec["mtp_deepseek_v3_main"]
    assert spec["eagle3_schedule_1.2"]["draft_len_schedule"] == {1: 4, 4: 2, 8: 0}
    assert spec["eagle3_schedule_main"]["draft_len_schedule"] == {3: 4, 7: 2}


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
def test_matrix_renders_and_round_trips_or_is_refused(method, backend, release):
    """The YAML renders and validates after safe_load exactly when TensorRT-LLM supports it."""
    supported = not any(
        f.severity is Severity.ERROR
        for f in support_findings(
            method,
            target_architecture=None,
            drafter_kind=None,
            backend=backend,
            release=release,
            sm=None,
        )
    )
    kwargs = {"drafter_ref": DRAFTERS[method], "max_draft_len": 3, "limits": LIMITS}
    if not supported:
        with pytest.raises(ConfigError) as info:
            render_speculative_yaml(method, release, backend, **kwargs)
        assert method in str(info.value) and release in str(info.value)
        return
    text = render_speculative_yaml(method, release, backend, **kwargs)
    options = yaml.safe_load(text)
    validate_options(options, release, backend, use_installed=False)
    spec = release_info(release).method(method, backend)
    assert options["speculative_config"]["decoding_type"] == spec.decoding_type
    assert options["speculative_config"]["max_draft_len"] == 3
    assert options.get("enable_iter_perf_stats") is (True if backend == "pytorch" else None)
    assert options["kv_cache_config"] == {"free_gpu_memory_fraction": 0.85}


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_baseline_renders_or_is_refused(release, backend):
    if backend not in release_info(release).backends:
        with pytest.raises(ConfigError, match="removed"):
            render_baseline_yaml(release, backend, limits=LIMITS)
        return
    options = yaml.safe_load(render_baseline_yaml(release, backend, limits=LIMITS))
    validate_options(options, release, backend, use_installed=False)
    assert "speculative_config" not in options
    assert options["max_batch_size"] == 64


@pytest.mark.parametrize(
    ("release", "backend"),
    [(r, b) for r in RELEASES for b in BACKENDS if b in release_info(r).backends],
)
def test_tune_measures_with_block_reuse_off_and_nothing_else_changed(release, backend, tmp_path):
    """KvCacheConfig.enable_block_reuse defaults to True in every release; tune resends its
    prompts, so it measures with reuse off. Every other option is the build's."""
    built = tmp_path / "baseline.yaml"
    limits = ServeLimits(max_batch_size=64, free_gpu_memory_fraction=0.8)
    built.write_text(render_baseline_yaml(release, backend, limits=limits))
    options = yaml.safe_load(measuring_yaml(built, release, backend))
    validate_options(options, release, backend, use_installed=False)
    original = yaml.safe_load(built.read_text())
    assert options.pop("kv_cache_config") == {
        "free_gpu_memory_fraction": 0.8,
        "enable_block_reuse": False,
    }
    original.pop("kv_cache_config")
    assert options == original


def test_schedule_translation():
    ranges = [(1, 4), (4, 2), (8, 0)]
    assert schedule_to_upper_bounds(ranges, None) == {3: 4, 7: 2}
    assert schedule_to_upper_bounds([(1, 4), (16, 2)], 64) == {15: 4, 64: 2}
    assert schedule_to_upper_bounds([(1, 4), (16, 2)], 8) == {8: 4}
    with pytest.raises(ConfigError, match="max_batch_size"):
        schedule_to_upper_bounds([(1, 4), (16, 2)], None)


def _spec(release, **kwargs):
    """EAGLE-3 on its gate-honouring path: two-model up to 1.2, one-model on main."""
    kwargs.setdefault("limits", LIMITS)
    kwargs.setdefault("two_model", release != "main")
    text = render_speculative_yaml(
        "eagle3", release, "pytorch", drafter_ref="d", max_draft_len=4, **kwargs
    )
    return yaml.safe_load(text)


def test_schedule_cuts_to_max_concurrency_on_1_1():
    options = _spec("1.1", draft_len_schedule={1: 4, 9: 0})
    assert options["speculative_config"]["max_concurrency"] == 8
    assert "draft_len_schedule" not in options["speculative_config"]
    assert 8 in options["cuda_graph_config"]["batch_sizes"]
    with pytest.raises(ConfigError, match="cut-off"):
        _spec("1.1", draft_len_schedule={1: 4, 4: 2, 9: 0})


def test_max_concurrency_per_release():
    assert _spec("1.2", max_concurrency=8)["speculative_config"]["max_concurrency"] == 8
    options = _spec("main", max_concurrency=8)
    assert options["speculative_config"]["max_concurrency"] == 8
    assert options["cuda_graph_config"]["batch_sizes"] == [1, 2, 4, 8, 16, 32, 64]
    for release in ("0.21", "1.0"):
        with pytest.raises(ConfigError, match="neither"):
            _spec(release, max_concurrency=8)
    with pytest.raises(ConfigError, match="not both"):
        _spec("1.2", max_concurrency=8, draft_len_schedule={1: 4, 9: 0})


def test_trivial_schedule_writes_nothing():
    options = _spec("1.0", draft_len_schedule={1: 4})
    assert set(options["speculative_config"]) == {
        "decoding_type",
        "max_draft_len",
        "speculative_model_dir",
        "eagle3_one_model",
    }
    assert "cuda_graph_config" not in options


def test_schedule_must_anchor_at_max_draft_len():
    with pytest.raises(ConfigError, match=r"draft_len_schedule\[1\]"):
        _spec("1.2", draft_len_schedule={1: 3, 8: 0})
    with pytest.raises(ConfigError, match="start at batch size 1"):
        _spec("1.2", draft_len_schedule={2: 4})
    with pytest.raises(ConfigError, match="outside"):
        _spec("main", draft_len_schedule={1: 4, 4: 5})


def test_cuda_graph_sizes_cover_schedule_keys_and_respect_given_sizes():
    limits = ServeLimits(max_batch_size=32, cuda_graph_batch_sizes=(1, 8, 32))
    options = _spec("main", draft_len_schedule={1: 4, 6: 2, 12: 0}, limits=limits)
    assert options["speculative_config"]["draft_len_schedule"] == {5: 4, 11: 2}
    assert options["cuda_graph_config"] == {
        "batch_sizes": [1, 5, 8, 11, 32],
        "enable_padding": True,
        "mode": "decode",
    }
    flat = _spec("0.21", limits=limits)
    assert flat["use_cuda_graph"] is True and flat["cuda_graph_batch_sizes"] == [1, 8, 32]


def test_drafter_rules():
    with pytest.raises(ConfigError, match="needs a draft model"):
        render_speculative_yaml("eagle3", "1.2", "pytorch", drafter_ref=None, max_draft_len=4)
    with pytest.raises(ConfigError, match="no separate draft model"):
        render_speculative_yaml("ngram", "1.2", "pytorch", drafter_ref="x", max_draft_len=4)
    with pytest.raises(ConfigError, match="no separate draft model"):
        render_speculative_yaml("mtp", "1.2", "pytorch", drafter_ref="x", max_draft_len=1)
    main_mtp = render_speculative_yaml("mtp", "main", "pytorch", drafter_ref="x", max_draft_len=1)
    assert yaml.safe_load(main_mtp)["speculative_config"]["speculative_model"] == "x"
    with pytest.raises(ConfigError, match="max_draft_len"):
        render_speculative_yaml("ngram", "1.2", "pytorch", drafter_ref=None, max_draft_len=0)


def test_extra_options_are_merged_and_validated():
    options = _spec(
        "1.2",
        extra={"kv_cache_config": {"enable_block_reuse": False}},
        speculative_extra={"eagle3_layers_to_capture": [1, 15, 28]},
    )
    assert options["kv_cache_config"] == {
        "free_gpu_memory_fraction": 0.85,
        "enable_block_reuse": False,
    }
    assert options["speculative_config"]["eagle3_layers_to_capture"] == [1, 15, 28]
    with pytest.raises(ConfigError) as info:
        _spec("1.2", extra={"kv_cache_config": {"block_reuse": False}})
    assert info.value.where == "kv_cache_config.block_reuse"
    with pytest.raises(ConfigError) as info:
        _spec("1.2", speculative_extra={"acceptance_rate_threshold": 0.3})
    assert info.value.where == "speculative_config.acceptance_rate_threshold"
    with pytest.raises(ConfigError, match="speculative_extra"):
        _spec("1.2", extra={"speculative_config": {}})


def test_serve_limits_validation():
    with pytest.raises(ConfigError, match="free_gpu_memory_fraction"):
        ServeLimits(free_gpu_memory_fraction=1.5)
    with pytest.raises(ConfigError, match="max_batch_size"):
        ServeLimits(max_batch_size=0)
    with pytest.raises(ConfigError, match="exceeds"):
        ServeLimits(max_batch_size=8, cuda_graph_batch_sizes=(1, 16))


def test_read_options_yaml(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(_render("eagle3_llama31_8b_1.2"))
    assert read_options_yaml(good, "1.2", "pytorch")["speculative_config"]["max_draft_len"] == 4
    with pytest.raises(ConfigError) as info:
        read_options_yaml(good, "1.0", "pytorch")
    assert str(good) in str(info.value) and "speculative_config.decoding_type" in str(info.value)
    broken = tmp_path / "broken.yaml"
    broken.write_text("speculative_config: [unclosed\n")
    with pytest.raises(BadInputError, match="not valid YAML"):
        read_options_yaml(broken, "1.2", "pytorch")
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(BadInputError, match="mapping"):
        read_options_yaml(listing, "1.2", "pytorch")
    with pytest.raises(BadInputError, match="cannot read"):
        read_options_yaml(tmp_path / "missing.yaml", "1.2", "pytorch")


@pytest.mark.parametrize(
    ("method", "release", "drafter"),
    [
        ("eagle3", "1.1", "d"),
        ("eagle3", "1.2", "d"),
        ("mtp", "1.1", None),
        ("mtp", "1.2", None),
    ],
)
def test_a_gate_the_release_ignores_is_refused(method, release, drafter):
    with pytest.raises(ConfigError, match=r"ignores it for .*one-model.*self\.drafter is not None"):
        render_speculative_yaml(
            method, release, "pytorch", drafter_ref=drafter, max_draft_len=1, max_concurrency=8
        )


def test_two_model_eagle3_writes_the_switch_and_is_refused_on_main():
    options = _spec("1.2", max_concurrency=8)
    assert options["speculative_config"]["eagle3_one_model"] is False
    assert _spec("main", max_concurrency=8)["speculative_config"].get("eagle3_one_model") is None
    with pytest.raises(ConfigError, match="no two-model"):
        _spec("main", max_concurrency=8, two_model=True)


@pytest.mark.parametrize("release", ["0.21", "1.0", "1.1", "1.2", "main"])
def test_baseline_and_speculative_get_the_same_graph_coverage(release):
    limits = ServeLimits(max_batch_size=48, cuda_graph_batch_sizes=(1, 2, 4, 8, 16, 32, 48))
    spec = yaml.safe_load(
        render_speculative_yaml(
            "ngram", release, "pytorch", drafter_ref=None, max_draft_len=3, limits=limits
        )
    )
    base = yaml.safe_load(render_baseline_yaml(release, "pytorch", limits=limits))
    graph_keys = ("cuda_graph_config", "cuda_graph_batch_sizes", "cuda_graph_padding_enabled")
    assert {k: spec.get(k) for k in graph_keys} == {k: base.get(k) for k in graph_keys}
    if release == "0.21":
        assert base["cuda_graph_padding_enabled"] is True
    else:
        assert base["cuda_graph_config"]["enable_padding"] is True
