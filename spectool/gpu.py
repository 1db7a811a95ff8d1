"""Find the NVIDIA GPUs on this machine and match them to spectool's GPU table.

Why: ``--gpu auto`` should pick the right memory, bandwidth and FLOP/s figures without the user
typing them. Detection asks NVML first (``pynvml`` from the optional ``nvidia-ml-py`` package,
imported lazily), then falls back to ``nvidia-smi --query-gpu``; with neither, or no GPU, it
returns an empty list. It never raises: a missing driver is a normal state on a laptop or CI.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from spectool.profiles import GpuSpec, gpu_for_device_name, load_gpu

# Columns asked of nvidia-smi, in order. ``compute_cap`` needs driver 510 or newer.
NVIDIA_SMI_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "memory.total",
    "compute_cap",
    "driver_version",
)
NVIDIA_SMI_FIELDS_OLD_DRIVER: tuple[str, ...] = ("index", "name", "memory.total", "driver_version")
# nvidia-smi answers in well under a second; a hung driver must not hang spectool.
NVIDIA_SMI_TIMEOUT_S: float = 10.0

_MIB = 1024 * 1024
_NOT_AVAILABLE = {
    "",
    "n/a",
    "[n/a]",
    "[not supported]",
    "[unknown error]",
    "[insufficient permissions]",
}


@dataclass(frozen=True)
class DetectedGpu:
    """One GPU as the driver reports it.

    ``memory_total_bytes`` is None where the driver reports no dedicated memory ("[N/A]" on
    unified-memory parts such as GB10); ``sm`` (compute capability major*10+minor) is None where
    the driver is too old to report it. ``spec`` is spectool's table entry for ``name``, or None
    for a device the table does not know.
    """

    index: int
    name: str
    memory_total_bytes: int | None
    sm: int | None
    driver_version: str
    spec: GpuSpec | None


def _cell(value: str) -> str | None:
    value = value.strip()
    return None if value.lower() in _NOT_AVAILABLE else value


def _sm_from_compute_cap(value: str) -> int:
    """Compute capability as nvidia-smi prints it to sm: "9.0" -> 90, "12.1" -> 121."""
    major, _, minor = value.partition(".")
    return int(major) * 10 + int(minor or "0")


def parse_nvidia_smi_csv(text: str, fields: Sequence[str] = NVIDIA_SMI_FIELDS) -> list[DetectedGpu]:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`` output.

    Pure. Example line: ``0, NVIDIA H100 80GB HBM3, 81559, 9.0, 550.54.15`` (memory in MiB).
    Blank lines are skipped; a row with a missing column or a non-numeric index raises
    ValueError naming the row.
    """
    name_at = fields.index("name")
    gpus: list[DetectedGpu] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        parts = [p.strip() for p in raw.split(",")]
        extra = len(parts) - len(fields)
        if extra < 0:
            raise ValueError(
                f"nvidia-smi row has {len(parts)} columns, expected {len(fields)}: {raw!r}"
            )
        if extra > 0:  # a comma inside the device name
            parts[name_at : name_at + extra + 1] = [", ".join(parts[name_at : name_at + extra + 1])]
        row = dict(zip(fields, parts, strict=True))
        try:
            index = int(row["index"])
            name = row["name"]
            memory_mib = _cell(row["memory.total"])
            memory_total_bytes = int(float(memory_mib) * _MIB) if memory_mib is not None else None
            cap = _cell(row.get("compute_cap", ""))
            sm = _sm_from_compute_cap(cap) if cap is not None else None
        except ValueError as exc:
            raise ValueError(f"unreadable nvidia-smi row {raw!r}: {exc}") from exc
        gpus.append(
            DetectedGpu(
                index=index,
                name=name,
                memory_total_bytes=memory_total_bytes,
                sm=sm,
                driver_version=_cell(row["driver_version"]) or "",
                spec=gpu_for_device_name(name),
            )
        )
    return gpus


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _detect_nvml() -> list[DetectedGpu] | None:
    """GPUs through NVML, or None when NVML cannot be used (no pynvml, library or driver)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus: list[DetectedGpu] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = _text(pynvml.nvmlDeviceGetName(handle))
            try:
                memory_total_bytes: int | None = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            except pynvml.NVMLError:  # unified-memory parts report none
                memory_total_bytes = None
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                sm: int | None = int(major) * 10 + int(minor)
            except pynvml.NVMLError:
                sm = None
            spec = gpu_for_device_name(name)
            gpus.append(DetectedGpu(index, name, memory_total_bytes, sm, driver_version, spec))
        return gpus
    except pynvml.NVMLError:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _run_nvidia_smi(
    nvidia_smi: str, fields: Sequence[str], timeout_s: float
) -> subprocess.CompletedProcess[str] | None:
    argv = [nvidia_smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):  # not installed, not executable, hung
        return None


def _detect_nvidia_smi(nvidia_smi: str, timeout_s: float) -> list[DetectedGpu]:
    fields: Sequence[str] = NVIDIA_SMI_FIELDS
    proc = _run_nvidia_smi(nvidia_smi, fields, timeout_s)
    if proc is not None and proc.returncode != 0 and "compute_cap" in proc.stdout + proc.stderr:
        fields = NVIDIA_SMI_FIELDS_OLD_DRIVER  # driver older than 510
        proc = _run_nvidia_smi(nvidia_smi, fields, timeout_s)
    if proc is None or proc.returncode != 0:  # e.g. "No devices were found", no driver
        return []
    try:
        return parse_nvidia_smi_csv(proc.stdout, fields)
    except ValueError:
        return []


def detect_gpus(
    *,
    use_nvml: bool = True,
    nvidia_smi: str = "nvidia-smi",
    timeout_s: float = NVIDIA_SMI_TIMEOUT_S,
) -> list[DetectedGpu]:
    """Every GPU the driver reports, in NVML index order; ``[]`` when there is none or no driver.

    NVML first (when ``use_nvml`` and importable), else ``nvidia_smi`` (a program name looked up
    on PATH, or a path) run with a list argv and ``timeout_s``. Never raises. Ignores
    ``CUDA_VISIBLE_DEVICES``: it lists physical GPUs.
    """
    if use_nvml:
        found = _detect_nvml()
        if found is not None:
            return found
    return _detect_nvidia_smi(nvidia_smi, timeout_s)


def resolve_gpu(arg: str | None) -> GpuSpec | None:
    """The GpuSpec for a ``--gpu`` value.

    None or "auto": the first detected GPU's spec (None when there is no GPU or the table does
    not know it). Anything else is a name or alias for :func:`spectool.profiles.load_gpu`,
    which raises ProfileError listing the known GPUs when it matches none.
    """
    if arg is None or arg.strip().lower() == "auto":
        gpus = detect_gpus()
        return gpus[0].spec if gpus else None
    return load_gpu(arg)
