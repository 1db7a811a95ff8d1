"""spectool.gpu: nvidia-smi parsing on real-format output, detection fallbacks, --gpu resolution.

This machine has no GPU, no NVML library and no nvidia-smi; where a test needs nvidia-smi it
runs a small stand-in script that prints real-format output, so the real subprocess path runs.
"""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from spectool.errors import ProfileError
from spectool.gpu import (
    NVIDIA_SMI_FIELDS,
    NVIDIA_SMI_FIELDS_OLD_DRIVER,
    DetectedGpu,
    detect_gpus,
    parse_nvidia_smi_csv,
    resolve_gpu,
)
from spectool.profiles import load_gpu

MIB = 1024 * 1024

# Rows as `nvidia-smi --query-gpu=index,name,memory.total,compute_cap,driver_version
# --format=csv,noheader,nounits` prints them (H100 and L40S rows as published in public test
# suites and logs; memory.total in MiB as nvidia-smi reports each part).
H100_ROW = "0, NVIDIA H100 80GB HBM3, 81559, 9.0, 550.54.15"
TWO_L40S = "0, NVIDIA L40S, 46068, 8.9, 535.183.06\n1, NVIDIA L40S, 46068, 8.9, 535.183.06\n"
EIGHT_B200 = "".join(f"{i}, NVIDIA B200, 183359, 10.0, 570.133.20\n" for i in range(8))


def _nvml_works() -> bool:
    try:
        import pynvml
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


# ------------------------------------------------------------------ parser (pure)


def test_parse_one_h100() -> None:
    (gpu,) = parse_nvidia_smi_csv(H100_ROW + "\n")
    assert gpu == DetectedGpu(
        index=0,
        name="NVIDIA H100 80GB HBM3",
        memory_total_bytes=81559 * MIB,
        sm=90,
        driver_version="550.54.15",
        spec=load_gpu("h100-sxm"),
    )


def test_parse_several_gpus_keeps_order_and_indices() -> None:
    gpus = parse_nvidia_smi_csv(TWO_L40S)
    assert [g.index for g in gpus] == [0, 1]
    assert {g.spec for g in gpus} == {load_gpu("l40s")}
    assert all(g.sm == 89 and g.memory_total_bytes == 46068 * MIB for g in gpus)
    eight = parse_nvidia_smi_csv(EIGHT_B200)
    assert [g.index for g in eight] == list(range(8))
    assert all(g.sm == 100 and g.spec == load_gpu("b200") for g in eight)


@pytest.mark.parametrize(
    ("row", "stem", "sm"),
    [
        ("0, NVIDIA H200, 143771, 9.0, 570.124.06", "h200", 90),
        ("0, NVIDIA A100-SXM4-40GB, 40960, 8.0, 535.104.05", "a100-40gb", 80),
        ("0, NVIDIA A100 80GB PCIe, 81920, 8.0, 580.159.04", "a100-80gb", 80),
        ("0, NVIDIA H100 PCIe, 81559, 9.0, 550.90.07", "h100-pcie", 90),
        ("0, NVIDIA GeForce RTX 4090, 24564, 8.9, 560.35.03", "rtx-4090", 89),
        ("0, NVIDIA A10G, 23028, 8.6, 535.183.01", "a10g", 86),
        ("0, NVIDIA L4, 23034, 8.9, 550.54.15", "l4", 89),
    ],
)
def test_parse_matches_each_device_to_its_spec(row: str, stem: str, sm: int) -> None:
    (gpu,) = parse_nvidia_smi_csv(row)
    assert gpu.spec == load_gpu(stem)
    assert gpu.sm == sm


def test_parse_unified_memory_part_and_unknown_device() -> None:
    """DGX Spark's GB10 reports memory.total as [N/A]; it is not in the table."""
    (gpu,) = parse_nvidia_smi_csv("0, NVIDIA GB10, [N/A], 12.1, 580.95.05\r\n\r\n")
    assert gpu.memory_total_bytes is None
    assert gpu.sm == 121
    assert gpu.spec is None
    assert gpu.driver_version == "580.95.05"


def test_parse_old_driver_columns_leave_sm_unknown() -> None:
    (gpu,) = parse_nvidia_smi_csv(
        "0, NVIDIA A100-SXM4-80GB, 81920, 470.57.02", NVIDIA_SMI_FIELDS_OLD_DRIVER
    )
    assert gpu.sm is None
    assert gpu.spec == load_gpu("a100-80gb")


def test_parse_keeps_a_comma_inside_a_device_name() -> None:
    (gpu,) = parse_nvidia_smi_csv("3, Odd, Name, 1024, 9.0, 550.1")
    assert (gpu.index, gpu.name, gpu.memory_total_bytes) == (3, "Odd, Name", 1024 * MIB)


def test_parse_empty_output_is_no_gpu() -> None:
    assert parse_nvidia_smi_csv("") == []
    assert parse_nvidia_smi_csv("\n  \n") == []


@pytest.mark.parametrize(
    "text",
    [
        "0, NVIDIA H100 80GB HBM3",
        "x, NVIDIA L4, 23034, 8.9, 550.54.15",
        "0, NVIDIA L4, lots, 8.9, 1",
    ],
)
def test_parse_malformed_row_is_a_value_error_naming_the_row(text: str) -> None:
    with pytest.raises(ValueError, match="nvidia-smi row"):
        parse_nvidia_smi_csv(text)


# ------------------------------------------------------------------ detection


def _fake_smi(tmp_path: Path, body: str) -> str:
    """A stand-in nvidia-smi: a shell script that checks its argv like the real one would."""
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_detection_on_this_machine_does_not_raise() -> None:
    gpus = detect_gpus()
    assert isinstance(gpus, list)
    assert all(isinstance(g, DetectedGpu) for g in gpus)
    if shutil.which("nvidia-smi") is None and not _nvml_works():  # this machine and CI
        assert gpus == []
        assert resolve_gpu("auto") is None
        assert resolve_gpu(None) is None
    else:  # a GPU host
        assert gpus
        assert resolve_gpu("auto") == gpus[0].spec


def test_nvml_unavailable_and_no_nvidia_smi_is_no_gpu(tmp_path: Path) -> None:
    gpus = detect_gpus(nvidia_smi=str(tmp_path / "absent-nvidia-smi"))
    if _nvml_works():
        assert all(g.sm is not None for g in gpus)
    else:
        assert gpus == []


def test_detect_through_nvidia_smi(tmp_path: Path) -> None:
    query = f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}"
    smi = _fake_smi(
        tmp_path,
        f'[ "$1" = "{query}" ] && [ "$2" = "--format=csv,noheader,nounits" ] || exit 2\n'
        f"printf '%s\\n' '{H100_ROW}'\n",
    )
    (gpu,) = detect_gpus(use_nvml=False, nvidia_smi=smi)
    assert gpu.spec == load_gpu("h100-sxm")
    assert gpu.memory_total_bytes == 81559 * MIB


def test_old_driver_without_compute_cap_is_retried_without_it(tmp_path: Path) -> None:
    smi = _fake_smi(
        tmp_path,
        'case "$1" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\''
        "; exit 2;; esac\n"
        "echo '0, NVIDIA A100-SXM4-40GB, 40960, 470.57.02'\n",
    )
    (gpu,) = detect_gpus(use_nvml=False, nvidia_smi=smi)
    assert gpu.sm is None
    assert gpu.spec == load_gpu("a100-40gb")


@pytest.mark.parametrize(
    "body",
    [
        "echo 'No devices were found'; exit 6\n",
        "echo 'NVIDIA-SMI has failed because it couldn''t communicate with the NVIDIA driver.'"
        "; exit 9\n",
        "echo 'garbage, output'\n",
    ],
)
def test_failing_nvidia_smi_is_no_gpu(tmp_path: Path, body: str) -> None:
    assert detect_gpus(use_nvml=False, nvidia_smi=_fake_smi(tmp_path, body)) == []


def test_hung_nvidia_smi_times_out_to_no_gpu(tmp_path: Path) -> None:
    smi = _fake_smi(tmp_path, "exec sleep 30\n")
    assert detect_gpus(use_nvml=False, nvidia_smi=smi, timeout_s=0.3) == []


def test_nvidia_smi_that_is_not_executable_is_no_gpu(tmp_path: Path) -> None:
    path = tmp_path / "nvidia-smi"
    path.write_text("not a program", encoding="utf-8")
    assert detect_gpus(use_nvml=False, nvidia_smi=str(path)) == []


# ------------------------------------------------------------------ --gpu resolution


@pytest.mark.parametrize(
    ("arg", "stem"), [("h100", "h100-sxm"), ("L40S", "l40s"), ("b200", "b200")]
)
def test_resolve_gpu_by_name(arg: str, stem: str) -> None:
    assert resolve_gpu(arg) == load_gpu(stem)


def test_resolve_unknown_gpu_is_a_profile_error() -> None:
    with pytest.raises(ProfileError, match="unknown GPU 'tpu-v5'; known: "):
        resolve_gpu("tpu-v5")
