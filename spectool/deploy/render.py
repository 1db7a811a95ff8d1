"""The config files of a build, rendered in memory and validated: TensorRT-LLM's
``speculative.yaml`` / ``baseline.yaml`` (by :mod:`spectool.trtllm.spec_yaml`, validated by
:mod:`spectool.trtllm.validate`) or the embedded engine's ``speculative.json`` /
``baseline.json`` (checked torch-free by :mod:`spectool.deploy.engine_config`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from spectool.check import CheckReport
from spectool.ckpt.inspect import Checkpoint
from spectool.deploy.manifest import CONFIG_FILES, LimitsRecord, model_ref
from spectool.deploy.runtime_gate import Gate
from spectool.errors import BadInputError

if TYPE_CHECKING:
    from spectool.deploy.build_request import BuildInputs, BuildRequest


def local_drafter(ref: str, drafter: Checkpoint | None, release: str, req: BuildRequest) -> str:
    """A local folder for a hub drafter on releases that cannot download it themselves."""
    if Path(ref).expanduser().is_dir():
        return ref
    if not req.download:
        raise BadInputError(
            "drafter",
            f"TensorRT-LLM {release}'s PyTorch backend needs a local draft model folder, not the "
            f"repo id {ref}; pass --download, or run `huggingface-cli download {ref} --local-dir "
            f"DIR` and give DIR as the drafter",
        )
    from huggingface_hub import snapshot_download

    try:
        revision = drafter.revision if drafter is not None else None
        return str(snapshot_download(ref, revision=revision or None))
    except Exception as exc:  # network, auth, missing repo: one line, exit 2
        raise BadInputError("drafter", f"cannot download {ref}: {exc}") from None


def _validated_yaml(text: str, release: str, backend: str) -> bytes:
    """Re-read the rendered YAML as TensorRT-LLM will and validate it for the release."""
    from spectool.trtllm.validate import validate_options

    validate_options(yaml.safe_load(text), release, backend)
    return text.encode("utf-8")


def trtllm_files(
    inputs: BuildInputs,
    limits: LimitsRecord,
    gate: Gate,
    speculative_extra: dict[str, Any] | None = None,
) -> dict[str, bytes]:
    from spectool.trtllm.releases import release_info
    from spectool.trtllm.spec_yaml import ServeLimits, render_baseline_yaml, render_speculative_yaml

    report = inputs.report
    assert report.trtllm is not None
    release, backend = report.trtllm["release"], report.trtllm["backend"]
    serve_limits = ServeLimits(
        free_gpu_memory_fraction=limits.free_gpu_memory_fraction,
        max_batch_size=limits.max_batch_size,
        max_num_tokens=limits.max_num_tokens,
        cuda_graph_batch_sizes=limits.cuda_graph_batch_sizes,
    )
    from spectool.trtllm.releases import LOCAL_DRAFTER_RELEASES

    spec = release_info(release).method(report.method, backend)
    drafter_ref = None
    drafter_given = report.drafter is not None or (
        report.target is None and report.extra.get("drafter_ref")
    )
    if drafter_given and spec is not None and spec.drafter_key is not None:
        drafter_ref = (
            model_ref(report.drafter) if report.drafter is not None else report.extra["drafter_ref"]
        )
        if backend == "pytorch" and release in LOCAL_DRAFTER_RELEASES:
            drafter_ref = local_drafter(drafter_ref, report.drafter, release, inputs.request)
    extra: dict[str, Any] = {"max_seq_len": limits.max_seq_len}
    req = inputs.request
    if not req.plain_tp:
        from spectool.errors import ConfigError
        from spectool.parallel import release_layout_problem

        layout = req.layout()
        problem = release_layout_problem(layout, release, backend)
        if problem is not None:
            raise ConfigError("--tp/--pp/--ep/--attention-dp", problem)
        extra.update(layout.llm_api_fields())
    speculative = render_speculative_yaml(
        report.method,
        release,
        backend,
        drafter_ref=drafter_ref,
        max_draft_len=report.max_draft_len,
        limits=serve_limits,
        speculative_extra=speculative_extra or None,
        extra=extra,
        **gate.kwargs,
    )
    baseline = render_baseline_yaml(release, backend, limits=serve_limits, extra=extra)
    names = CONFIG_FILES["trtllm"]
    return {
        names[0]: _validated_yaml(speculative, release, backend),
        names[1]: _validated_yaml(baseline, release, backend),
    }


def torch_engine_configs(
    report: CheckReport, limits: LimitsRecord, gate: Gate
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(speculative, baseline) EngineConfig fields for the embedded engine, validated."""
    from spectool.deploy.engine_config import validate_engine_config

    common = {"max_batch_size": limits.max_batch_size, "max_seq_len": limits.max_seq_len}
    schedule = gate.kwargs.get("draft_len_schedule")
    speculative: dict[str, Any] = {"method": report.method, "max_draft_len": report.max_draft_len}
    # only the gate that applies (no ``null`` beside a limit): a schedule, a cut-off, or neither
    if schedule:
        speculative["draft_len_schedule"] = {str(b): k for b, k in schedule.items()}
    if gate.kwargs.get("max_concurrency") is not None:
        speculative["max_concurrency"] = gate.kwargs["max_concurrency"]
    speculative.update(common)
    baseline = {"method": "none", **common}  # no draft length: it does not speculate
    for config in (speculative, baseline):
        validate_engine_config(config)  # ConfigError for anything the engine would refuse
    return speculative, baseline


def json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode("utf-8")
