"""Release tables: reproducible from the research extraction, consistent with spectool's policy."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

from spectool.errors import ConfigError
from spectool.trtllm.releases import (
    METHODS,
    RELEASES,
    detect_installed_version,
    load_schema,
    release_for_version,
    release_info,
)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "extract_trtllm_schema.py"
RESEARCH = REPO / "tests" / "fixtures" / "trtllm-schema"


def _script():
    spec = importlib.util.spec_from_file_location("extract_trtllm_schema", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_tables_are_what_the_script_generates():
    files = _script().generate(RESEARCH)
    assert sorted(files) == sorted(f"{r}.json" for r in RELEASES)
    shipped = REPO / "spectool" / "trtllm" / "schema"
    for name, text in files.items():
        assert (shipped / name).read_text() == text, f"{name} is stale: run {SCRIPT.name}"


@pytest.mark.parametrize(
    ("release", "drafter_keys", "has_concurrency", "has_schedule", "gate"),
    [
        ("0.21", ["speculative_model"], False, False, None),
        ("1.0", ["speculative_model_dir"], False, False, None),
        ("1.1", ["speculative_model_dir"], True, False, "acceptance_window"),
        ("1.2", ["speculative_model", "speculative_model_dir"], True, True, "acceptance_window"),
        (
            "main",
            ["speculative_model", "speculative_model_dir"],
            True,
            True,
            "acceptance_rate_window_size",
        ),
    ],
)
def test_field_tables_follow_the_renames(
    release, drafter_keys, has_concurrency, has_schedule, gate
):
    schema = load_schema(release)
    base = schema.cls("DecodingBaseConfig")
    assert [k for k in base.keys if "speculative_model" in k] == drafter_keys
    info = release_info(release)
    assert info.has_max_concurrency is has_concurrency
    assert info.has_draft_len_schedule is has_schedule
    assert (info.acceptance_gate_keys or (None,))[0] == gate


def test_0_21_generation_has_the_pre_1_0_names():
    schema = load_schema("0.21")
    assert "pytorch_weights_path" in schema.cls("EagleDecodingConfig").keys
    assert "pytorch_weights_path" in schema.cls("DraftTargetDecodingConfig").keys
    assert "prompt_lookup_num_tokens" in schema.cls("NGramDecodingConfig").keys
    torch = schema.top_class("pytorch")
    assert {"use_cuda_graph", "cuda_graph_batch_sizes", "autotuner_enabled"} <= set(torch.keys)
    assert "cuda_graph_config" not in torch.keys
    assert schema.speculative.class_for("Eagle3") is None


def test_decoding_type_spellings_per_generation():
    assert load_schema("1.0").speculative.class_for("DraftTarget") == "DraftTargetDecodingConfig"
    assert load_schema("1.0").speculative.class_for("Draft_Target") is None
    assert load_schema("1.1").speculative.class_for("Eagle3") is None
    for release in ("1.2", "main"):
        spec = load_schema(release).speculative
        assert spec.class_for("Eagle3") == "Eagle3DecodingConfig"
        assert spec.class_for("Draft_Target") == "DraftTargetDecodingConfig"
        assert spec.class_for("DraftTarget") == "DraftTargetDecodingConfig"  # documented alias
    assert load_schema("main").speculative.class_for("Medusa") is None


def test_main_has_no_tensorrt_backend():
    info = release_info("main")
    assert info.backends == ("pytorch",)
    assert load_schema("main").top_level["tensorrt"] is None
    assert "removed" in info.backend_missing_reason("tensorrt")
    with pytest.raises(ConfigError, match="tensorrt"):
        load_schema("main").top_class("tensorrt")


@pytest.mark.parametrize("release", RELEASES)
def test_policy_keys_exist_in_the_release_tables(release):
    """Every key spectool writes is one the release's own classes accept."""
    info = release_info(release)
    schema = info.schema
    for (method, backend), spec in info.methods.items():
        assert method in METHODS
        assert schema.speculative.class_for(spec.decoding_type) == spec.config_class
        cls = schema.cls(spec.config_class)
        written = [*spec.depth_keys, *spec.fixed]
        if spec.drafter_key:
            written.append(spec.drafter_key)
        for key in written:
            assert key in cls.keys, (release, method, key)
        top = schema.top_class(backend)
        for key in spec.top_level:
            assert key in top.keys, (release, method, key)
        assert backend in info.class_backends[spec.config_class]


@pytest.mark.parametrize(
    ("release", "style"),
    [
        ("0.21", "flat"),
        ("1.0", "config"),
        ("1.1", "config"),
        ("1.2", "config"),
        ("main", "config_mode"),
    ],
)
def test_cuda_graph_style(release, style):
    assert release_info(release).cuda_graph_style == style


@pytest.mark.parametrize(
    ("version", "release"),
    [
        ("0.21.0", "0.21"),
        ("1.0.0", "1.0"),
        ("1.0.0rc4", "1.0"),
        ("1.1.0.post1", "1.1"),
        ("1.2.0rc6", "1.2"),
        ("1.2.1", "1.2"),
        ("1.3.0rc24", "main"),
        ("1.4.0.dev2026", "main"),
        ("1.4.0rc4", "main"),
        ("2.0.0", "main"),
        ("v1.2.0", "1.2"),
    ],
)
def test_release_for_version(version, release):
    assert release_for_version(version) == release


@pytest.mark.parametrize("version", ["0.20.0", "0.9.0.dev2024022700", "banana", ""])
def test_release_for_version_refuses(version):
    with pytest.raises(ConfigError, match="tensorrt_llm version"):
        release_for_version(version)


def test_detect_installed_version_matches_package_metadata():
    try:
        expected = importlib.metadata.version("tensorrt_llm")
    except importlib.metadata.PackageNotFoundError:
        expected = None
    assert detect_installed_version() == expected


def test_unknown_release_is_a_config_error():
    with pytest.raises(ConfigError, match="known: 0.21, 1.0, 1.1, 1.2, main"):
        release_info("1.5")
