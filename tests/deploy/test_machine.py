"""A build's manifest against this machine: GPU, TensorRT-LLM, engines, checkpoints, files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ckpt_factory import build_checkpoint
from deploy_helpers import EAGLE3, LLAMA

from spectool.deploy.build import BuildRequest, check_build, plan_build, write_build
from spectool.deploy.launch import prepare_serve
from spectool.deploy.machine import (
    MachineFacts,
    changed_files,
    engine_dir_problems,
    machine_problems,
)
from spectool.deploy.manifest import EngineBuildRecord, Manifest, read_manifest
from spectool.errors import BadInputError, BuildMismatchError, EngineMissingError
from spectool.gpu import DetectedGpu
from spectool.profiles import load_gpu

GIB = 2**30


def gpu(table_name: str, memory_gib: float, sm: int | None = None) -> DetectedGpu:
    spec = load_gpu(table_name)
    return DetectedGpu(
        0, spec.name, int(memory_gib * GIB), spec.sm if sm is None else sm, "550.54", spec
    )


H100 = gpu("h100-sxm", 79.6)


@pytest.fixture(scope="module")
def manifest(make_ckpt) -> Manifest:
    req = BuildRequest(
        target=str(make_ckpt(LLAMA)),
        drafter=str(make_ckpt(EAGLE3)),
        gpu="h100-sxm",
        trtllm_version="1.2.1",
        out=Path("/nonexistent/b"),
    )
    return plan_build(check_build(req)).manifest


def facts(
    *gpus: DetectedGpu, trtllm: str | None = "1.2.1", tensorrt: str | None = None
) -> MachineFacts:
    return MachineFacts(tuple(gpus), trtllm, tensorrt)


def test_the_machine_it_was_built_for_fits(manifest: Manifest) -> None:
    check = machine_problems(manifest, facts(H100))
    assert check.errors == () and check.warnings == ()


@pytest.mark.parametrize(
    ("machine", "needles"),
    [
        (facts(), ["no NVIDIA GPU found", "H100 SXM (SM90"]),
        (facts(gpu("a100-80gb", 79.2)), ["SM80", "SM90", "rebuild"]),
        (facts(gpu("l40s", 44.5)), ["SM89", "44.5 GiB"]),
        (
            facts(H100, trtllm="1.3.0rc24"),
            ["1.3.0rc24 is generation main", "TensorRT-LLM 1.2 (1.2.1)"],
        ),
        (facts(H100, trtllm="0.20.0"), ["older than 0.21"]),
    ],
)
def test_mismatches_are_errors_with_the_reason(
    manifest: Manifest, machine: MachineFacts, needles: list[str]
) -> None:
    errors = " | ".join(machine_problems(manifest, machine).errors)
    for needle in needles:
        assert needle in errors


def test_memory_tensor_parallel_and_unknown_versions(manifest: Manifest) -> None:
    h200_build = manifest.model_copy(
        update={"gpu": manifest.gpu.model_copy(update={"name": "H200 SXM", "memory_gib": 141.0})}
    )
    errors = machine_problems(h200_build, facts(H100)).errors
    assert len(errors) == 1 and "fitted to 141 GiB" in errors[0]
    bigger = machine_problems(manifest, facts(gpu("h200", 140.4, sm=90))).warnings
    assert any("more than the 80 GiB" in w for w in bigger)
    tp2 = manifest.model_copy(update={"tp": 2})
    assert any("tp=2" in e for e in machine_problems(tp2, facts(H100)).errors)
    unknown = machine_problems(manifest, facts(H100, trtllm=None))
    assert unknown.errors == () and "cannot tell which TensorRT-LLM" in unknown.warnings[0]


def test_legacy_engines_are_tied_to_versions_and_must_exist(
    manifest: Manifest, tmp_path: Path
) -> None:
    trt = manifest.trtllm.model_copy(
        update={"backend": "tensorrt", "version": "1.2.0", "tensorrt_version": "10.11.0"}
    )
    record = EngineBuildRecord(
        engine_dir="engine", baseline_engine_dir="baseline-engine", steps=(), runnable=True
    )
    legacy = manifest.model_copy(update={"trtllm": trt, "engine_build": record})
    errors = " | ".join(
        machine_problems(legacy, facts(H100, trtllm="1.2.1", tensorrt="10.13.0")).errors
    )
    assert "built with TensorRT-LLM 1.2.0, installed is 1.2.1" in errors
    assert "TensorRT 10.11.0, installed is 10.13.0" in errors
    here = facts(H100, trtllm="1.2.0")
    missing = engine_dir_problems(tmp_path, legacy, here)
    assert len(missing) == 2 and "no TensorRT engine" in missing[0] and "engine steps" in missing[0]
    for name, version in (("engine", "1.2.0"), ("baseline-engine", "1.1.0")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"version": version}))
    problems = engine_dir_problems(tmp_path, legacy, here)
    assert "lacks rank0.engine" in problems[0] and "built by TensorRT-LLM 1.1.0" in problems[1]
    (tmp_path / "engine" / "rank0.engine").write_bytes(b"\0")
    assert len(engine_dir_problems(tmp_path, legacy, here)) == 1


def test_changed_checkpoint_and_edited_files(tmp_path: Path) -> None:
    target = build_checkpoint(LLAMA, tmp_path / "ckpt")
    drafter = build_checkpoint(EAGLE3, tmp_path / "ckpt")
    out = tmp_path / "b"
    req = BuildRequest(target=str(target), drafter=str(drafter), gpu="h100-sxm", out=out)
    write_build(plan_build(check_build(req)), force=False)
    m = read_manifest(out)
    assert machine_problems(m, facts(H100)).errors == ()
    config = json.loads((target / "config.json").read_text())
    config["rope_theta"] = 1.0
    (target / "config.json").write_text(json.dumps(config))
    errors = machine_problems(m, facts(H100)).errors
    assert (
        len(errors) == 1
        and "target's config.json" in errors[0]
        and "changed since the build" in errors[0]
    )
    with (out / "speculative.yaml").open("a") as f:
        f.write("# tuned by hand\n")
    assert changed_files(out, m) == ["speculative.yaml"]
    # prepare_serve refuses the mismatch as one error listing every reason.
    with pytest.raises(BuildMismatchError, match="changed since the build"):
        prepare_serve(out, facts=facts(), trtllm_serve="/usr/bin/trtllm-serve")
    with pytest.raises(BadInputError, match="built for engine trtllm"):
        prepare_serve(out, engine="torch", facts=facts(H100))


def test_missing_trtllm_serve_is_reported_before_the_machine(
    make_ckpt, tmp_path: Path, monkeypatch
) -> None:
    out = tmp_path / "b"
    req = BuildRequest(
        target=str(make_ckpt(LLAMA)), drafter=str(make_ckpt(EAGLE3)), gpu="h100-sxm", out=out
    )
    write_build(plan_build(check_build(req)), force=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        EngineMissingError, match="trtllm-serve not found.*pip install tensorrt-llm"
    ):
        prepare_serve(out, facts=facts())
    plan = prepare_serve(
        out,
        facts=facts(H100),
        trtllm_serve="/opt/bin/trtllm-serve",
        port=8123,
        extra=["--log_level", "debug"],
    )
    assert plan.command.argv[:2] == ("/opt/bin/trtllm-serve", str(make_ckpt(LLAMA)))
    assert plan.command.argv[-4:] == (
        "--config",
        str(out / "speculative.yaml"),
        "--log_level",
        "debug",
    )
    assert "8123" in plan.command.argv and plan.gate.warn  # no decision: unmeasured
