"""spectool.profiles: every shipped YAML validates, names match loosely, bad files are named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectool.errors import BadInputError, ProfileError
from spectool.profiles import (
    METHODS,
    METHODS_WITHOUT_DRAFTER,
    GpuSpec,
    Recipe,
    gpu_for_device_name,
    is_profile_name,
    list_gpus,
    list_profiles,
    load_gpu,
    load_gpu_table,
    load_profile,
    load_recipe_table,
    normalize_name,
    profiles_root,
)

REPO = Path(__file__).resolve().parents[1]
EXPECTED_PAIRS = REPO / "tests" / "fixtures" / "ckpt" / "expected_pairs.json"

REQUIRED_GPUS = {
    "h100-sxm", "h100-pcie", "h200", "a100-40gb", "a100-80gb",
    "l40s", "l4", "a10g", "b200", "gb200", "rtx-4090",
}  # fmt: skip
REQUIRED_PROFILES = {
    "llama-3.1-8b-eagle3", "llama-3.3-70b-eagle3", "qwen3-4b-draft", "qwen3-8b-draft",
    "qwen2.5-7b-draft", "llama-3.1-8b-draft", "deepseek-v3-mtp", "deepseek-r1-mtp",
    "mimo-7b-mtp", "gpt-oss-120b-eagle3", "qwen3-8b-ngram", "llama-2-7b-eagle", "demo",
}  # fmt: skip

GOOD_GPU = """\
name: Test GPU
aliases: [tgpu]
sm: 90
memory_gib: 80
hbm_bandwidth_gbs: 3000
bf16_dense_tflops: 900
fp8_dense_tflops: 1800
"""
GOOD_RECIPE = """\
name: {name}
target: owner/target
drafter: owner/drafter
method: draft_model
max_draft_len: 3
notes: A test pair.
source: owner/repo:docs/x.md
"""


# ------------------------------------------------------------------ shipped GPU table


def test_shipped_gpu_table_loads_and_covers_the_required_gpus() -> None:
    table = load_gpu_table()
    assert REQUIRED_GPUS <= set(table)
    assert list_gpus() == sorted(table)
    assert all(isinstance(spec, GpuSpec) for spec in table.values())


def test_every_gpu_file_names_its_sources_and_uses_dashed_lowercase_names() -> None:
    for file in sorted((REPO / "profiles" / "gpus").glob("*.yaml")):
        text = file.read_text(encoding="utf-8")
        assert text.startswith("# Sources: https://"), file.name
        assert file.stem == file.stem.lower()
        assert " " not in file.stem
        assert "_" not in file.stem


def test_gpu_figures_are_internally_consistent() -> None:
    """Catches data-entry slips: FP8 is twice BF16 on every FP8-capable part, Ampere has no FP8,
    and the H200 is an H100 with more, faster memory."""
    for stem, spec in load_gpu_table().items():
        if spec.sm < 89:
            assert spec.fp8_dense_tflops is None, stem
        else:
            assert spec.fp8_dense_tflops is not None, stem
            assert 1.9 <= spec.fp8_dense_tflops / spec.bf16_dense_tflops <= 2.1, stem
    h100, h200 = load_gpu("h100-sxm"), load_gpu("h200")
    assert h200.bf16_dense_tflops == h100.bf16_dense_tflops
    assert h200.memory_gib > h100.memory_gib
    assert h200.hbm_bandwidth_gbs > h100.hbm_bandwidth_gbs
    assert load_gpu("a100-80gb").memory_bytes == 80 * 2**30
    assert load_gpu("h100-sxm").bandwidth_bytes_per_s == 3.35e12


# ------------------------------------------------------------------ GPU name matching


@pytest.mark.parametrize(
    ("name", "stem"),
    [
        ("h100-sxm", "h100-sxm"),
        ("H100 SXM", "h100-sxm"),
        ("h100_sxm5", "h100-sxm"),
        ("H100", "h100-sxm"),
        ("h100 pcie", "h100-pcie"),
        ("H200", "h200"),
        ("a100_80gb", "a100-80gb"),
        ("A100 40GB", "a100-40gb"),
        ("GB200", "gb200"),
        ("4090", "rtx-4090"),
        ("RTX 4090", "rtx-4090"),
        ("NVIDIA L40S", "l40s"),
    ],
)
def test_load_gpu_matches_stem_name_or_alias_loosely(name: str, stem: str) -> None:
    assert load_gpu(name) == load_gpu_table()[stem]


def test_load_gpu_returns_the_cached_object() -> None:
    assert load_gpu("h100") is load_gpu("H100 SXM")


@pytest.mark.parametrize("name", ["x", "h300", "l40", "a100", ""])
def test_unknown_gpu_is_a_profile_error_listing_the_known_ones(name: str) -> None:
    with pytest.raises(ProfileError) as info:
        load_gpu(name)
    message = str(info.value)
    assert f"unknown GPU {name!r}" in message
    assert all(stem in message for stem in REQUIRED_GPUS)
    assert isinstance(info.value, BadInputError)
    assert info.value.exit_code == 2


@pytest.mark.parametrize(
    ("device_name", "stem"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100 80GB PCIe", "a100-80gb"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ],
)
def test_nvml_device_names_map_to_their_spec(device_name: str, stem: str) -> None:
    assert gpu_for_device_name(device_name) == load_gpu_table()[stem]


@pytest.mark.parametrize(
    "device_name",
    ["NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA L40", "NVIDIA A10", "Tesla T4", "NVIDIA GB10"],
)
def test_lookalike_devices_are_not_guessed(device_name: str) -> None:
    """Different parts with a known part's name as a prefix: wrong figures are worse than none."""
    assert gpu_for_device_name(device_name) is None


def test_normalize_name_drops_vendor_words_case_and_separators() -> None:
    assert normalize_name("NVIDIA GeForce RTX 4090") == "rtx4090"
    assert normalize_name(" H100_sxm-5 ") == "h100sxm5"
    assert normalize_name("NVIDIA") == "nvidia"


# ------------------------------------------------------------------ shipped recipes


def test_shipped_recipes_load_and_cover_the_documented_pairs() -> None:
    table = load_recipe_table()
    assert REQUIRED_PROFILES <= set(table)
    assert list_profiles() == sorted(table)
    for name, recipe in table.items():
        assert isinstance(recipe, Recipe)
        assert recipe.name == name
        assert recipe.method in METHODS
        assert recipe.max_draft_len >= 1
        assert (recipe.drafter is None) == (recipe.method in METHODS_WITHOUT_DRAFTER), name
        assert recipe.source.startswith("https://") or ":" in recipe.source


def test_demo_profile_is_spectools_embedded_pair() -> None:
    demo = load_profile("demo")
    assert (demo.target, demo.drafter) == ("spectool:demo-target-mtp", "spectool:demo-drafter")
    assert [a.method for a in demo.alternatives] == ["eagle3", "mtp", "ngram"]
    assert (demo.method, demo.max_draft_len) == ("draft_model", 4)


def test_recipes_agree_with_the_checker_fixture_verdicts() -> None:
    """Every recipe whose pair is in the checker fixtures (tests/fixtures/ckpt) is a compatible pair there."""
    pairs = json.loads(EXPECTED_PAIRS.read_text(encoding="utf-8"))["pairs"]
    verdicts = {(p["target"], p["drafter"], p["method"]): p["verdict"] for p in pairs}
    matched = 0
    for recipe in load_recipe_table().values():
        key = (recipe.target, recipe.drafter or "self", recipe.method)
        if key in verdicts:
            matched += 1
            assert verdicts[key].startswith("compatible"), recipe.name
    assert matched >= 5  # llama eagle3, llama2 eagle, deepseek mtp, llama/qwen3 draft models


@pytest.mark.parametrize("name", ["llama-3.1-8b-eagle3", "LLAMA_3.1_8B_EAGLE3", "Demo"])
def test_profile_names_match_case_and_separator_insensitively(name: str) -> None:
    assert is_profile_name(name)
    assert load_profile(name).name == name.lower().replace("_", "-")


@pytest.mark.parametrize(
    "text", ["meta-llama/Llama-3.1-8B-Instruct", "./demo", "demo/", "no-such-profile", ""]
)
def test_repo_ids_paths_and_unknown_names_are_not_profiles(text: str) -> None:
    assert not is_profile_name(text)


def test_unknown_profile_is_a_profile_error_listing_the_known_ones() -> None:
    with pytest.raises(ProfileError, match=r"unknown profile 'nope'; known: .*demo"):
        load_profile("nope")


def test_profiles_root_holds_the_recipe_and_gpu_files() -> None:
    root = profiles_root()
    assert root.joinpath("demo.yaml").is_file()
    assert root.joinpath("gpus").joinpath("h100-sxm.yaml").is_file()


# ------------------------------------------------------------------ bad files


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def test_custom_gpu_folder_loads(tmp_path: Path) -> None:
    _write(tmp_path, "test-gpu.yaml", GOOD_GPU)
    table = load_gpu_table(tmp_path)
    assert table["test-gpu"].bf16_dense_tflops == 900


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("name: [unclosed\n", "malformed YAML"),
        ("- just\n- a list\n", "expected a mapping of keys, got list"),
        (GOOD_GPU + "tdp_watts: 700\n", "tdp_watts: Extra inputs are not permitted"),
        (GOOD_GPU.replace("fp8_dense_tflops: 1800\n", ""), "fp8_dense_tflops: Field required"),
        (GOOD_GPU.replace("memory_gib: 80", "memory_gib: -1"), "memory_gib"),
        (GOOD_GPU.replace("sm: 90", "sm: hopper"), "sm"),
    ],
)
def test_bad_gpu_file_is_a_profile_error_naming_the_file(
    tmp_path: Path, text: str, problem: str
) -> None:
    _write(tmp_path, "good.yaml", GOOD_GPU)
    bad = _write(tmp_path, "bad.yaml", text)
    with pytest.raises(ProfileError) as info:
        load_gpu_table(tmp_path)
    assert info.value.where == str(bad)
    assert problem in info.value.problem


def test_two_gpu_files_claiming_one_alias_is_a_profile_error(tmp_path: Path) -> None:
    _write(tmp_path, "a.yaml", GOOD_GPU)
    second = _write(tmp_path, "b.yaml", GOOD_GPU.replace("Test GPU", "Other GPU"))
    with pytest.raises(ProfileError, match="'tgpu' is already used by a.yaml") as info:
        load_gpu_table(tmp_path)
    assert info.value.where == str(second)


def test_missing_folder_is_a_profile_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="profile folder not found"):
        load_gpu_table(tmp_path / "absent")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("target: [\n", "malformed YAML"),
        (GOOD_RECIPE.format(name="other"), "differs from the file name"),
        (GOOD_RECIPE.format(name="bad").replace("draft_model", "lookahead"), "method"),
        (
            GOOD_RECIPE.format(name="bad").replace("max_draft_len: 3", "max_draft_len: 0"),
            "max_draft_len",
        ),
        (GOOD_RECIPE.format(name="bad").replace("draft_model", "mtp"), "mtp takes no drafter"),
        (GOOD_RECIPE.format(name="bad").replace("owner/drafter", "null"), "needs a drafter"),
        (GOOD_RECIPE.format(name="bad").replace("owner/target", "not a repo id"), "target"),
        (GOOD_RECIPE.format(name="bad").replace("owner/repo:docs/x.md", "the docs"), "source"),
        (GOOD_RECIPE.format(name="bad") + "engine: trtllm\n", "engine: Extra inputs"),
    ],
)
def test_bad_recipe_file_is_a_profile_error_naming_the_file(
    tmp_path: Path, text: str, problem: str
) -> None:
    _write(tmp_path, "good.yaml", GOOD_RECIPE.format(name="good"))
    bad = _write(tmp_path, "bad.yaml", text)
    with pytest.raises(ProfileError) as info:
        load_recipe_table(tmp_path)
    assert info.value.where == str(bad)
    assert problem in info.value.problem


def test_mtp_and_ngram_recipes_take_no_drafter(tmp_path: Path) -> None:
    for method in sorted(METHODS_WITHOUT_DRAFTER):
        text = GOOD_RECIPE.format(name=method).replace("owner/drafter", "null")
        _write(tmp_path, f"{method}.yaml", text.replace("draft_model", method))
    table = load_recipe_table(tmp_path)
    assert {r.method for r in table.values()} == METHODS_WITHOUT_DRAFTER
