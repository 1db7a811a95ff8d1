"""``spectool build`` end to end on real (sparse) fixture checkpoints and tiny real models."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
import yaml
from deploy_helpers import EAGLE1, EAGLE3, LLAMA, write_decision

from spectool.cli.app import main
from spectool.deploy.build import BuildRequest, check_build, plan_build, resolve_build_gpu
from spectool.errors import BadInputError
from spectool.gpu import DetectedGpu
from spectool.profiles import load_gpu
from spectool.trtllm.validate import validate_options


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["build", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _pair(make_ckpt, drafter: str = EAGLE3) -> list[str]:
    return [str(make_ckpt(LLAMA)), str(make_ckpt(drafter))]


def test_build_writes_validated_configs_and_a_true_manifest(make_ckpt, tmp_path, capsys) -> None:
    out = tmp_path / "b"
    argv = [*_pair(make_ckpt), "--gpu", "h100-sxm", "--trtllm-version", "1.2.1", "--out", str(out)]
    code, stdout, err = build(capsys, *argv)
    assert code == 0, stdout + err
    assert sorted(p.name for p in out.iterdir()) == [
        "baseline.yaml",
        "manifest.json",
        "speculative.yaml",
    ]
    m = json.loads((out / "manifest.json").read_text())
    assert m["files"] == {n: sha(out / n) for n in ("speculative.yaml", "baseline.yaml")}
    assert m["target"]["config_sha256"] == sha(make_ckpt(LLAMA) / "config.json")
    assert m["drafter"]["config_sha256"] == sha(make_ckpt(EAGLE3) / "config.json")
    assert (m["method"], m["max_draft_len"], m["engine"]) == ("eagle3", 4, "trtllm")
    assert m["trtllm"] == {
        "version": "1.2.1",
        "installed": None,
        "release": "1.2",
        "backend": "pytorch",
        "tensorrt_version": None,
    }
    assert (m["gpu"]["name"], m["gpu"]["sm"], m["gpu"]["memory_gib"]) == ("H100 SXM", 90, 80.0)
    spec = yaml.safe_load((out / "speculative.yaml").read_text())
    base = yaml.safe_load((out / "baseline.yaml").read_text())
    for options in (spec, base):
        validate_options(options, "1.2", "pytorch")
    assert spec["speculative_config"] == {
        "decoding_type": "Eagle3",
        "max_draft_len": 4,
        "speculative_model_dir": str(make_ckpt(EAGLE3)),
    }
    assert "speculative_config" not in base
    assert {k: v for k, v in spec.items() if k != "speculative_config"} == base
    # Limits fitted to the H100 memory estimate of spectool check (8192-token sequences).
    code, check_out, _ = (
        main(["check", *_pair(make_ckpt), "--gpu", "h100-sxm", "--json"]),
        *capsys.readouterr(),
    )
    fit = json.loads(check_out)["memory"]["sequences_with_drafter"]
    assert spec["max_batch_size"] == m["limits"]["max_batch_size"] == fit
    assert spec["enable_iter_perf_stats"] is True and spec["max_seq_len"] == 8192
    assert 0.5 < spec["kv_cache_config"]["free_gpu_memory_fraction"] <= 0.9
    assert spec["cuda_graph_config"]["batch_sizes"][-1] == fit
    assert m["commands"]["serve"][:2] == ["trtllm-serve", str(make_ckpt(LLAMA))]
    assert m["commands"]["serve"][-2:] == ["--config", str(out / "speculative.yaml")]
    assert m["commands"]["serve_baseline"][-1] == str(out / "baseline.yaml")
    # The recorded build command reproduces the folder byte for byte (identical rebuild is fine).
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, _, err = build(capsys, *m["commands"]["build"][2:])
    assert code == 0, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_incompatible_pair_is_refused_and_nothing_written(make_ckpt, tmp_path, capsys) -> None:
    out = tmp_path / "b"
    code, stdout, _ = build(
        capsys,
        *_pair(make_ckpt, EAGLE1),
        "--method",
        "eagle3",
        "--gpu",
        "h100-sxm",
        "--out",
        str(out),
    )
    assert code == 1
    assert "WRONG_EAGLE_GENERATION_EAGLE1_AS_EAGLE3" in stdout and "build refused" in stdout
    assert not out.exists()


def test_different_build_needs_force_identical_does_not(make_ckpt, tmp_path, capsys) -> None:
    out = tmp_path / "b"
    base = [*_pair(make_ckpt), "--gpu", "h100-sxm", "--out", str(out)]
    assert build(capsys, *base)[0] == 0
    first = (out / "manifest.json").read_bytes()
    code, _, err = build(capsys, *base, "--max-draft-len", "3")
    assert code == 2 and "--force" in err and "max_draft_len" in err and err.count("\n") == 1
    assert (out / "manifest.json").read_bytes() == first
    assert build(capsys, *base, "--max-draft-len", "3", "--force")[0] == 0
    assert json.loads((out / "manifest.json").read_text())["max_draft_len"] == 3
    # Replacing it with an embedded-engine build removes the files only the old build listed.
    code, _, err = build(
        capsys,
        str(make_ckpt(LLAMA)),
        str(make_ckpt("meta-llama/Llama-3.2-1B-Instruct")),
        "--engine",
        "torch",
        "--out",
        str(out),
        "--force",
    )
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == [
        "baseline.json",
        "manifest.json",
        "speculative.json",
    ]
    stranger = tmp_path / "other"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    code, _, err = build(capsys, *_pair(make_ckpt), "--gpu", "h100-sxm", "--out", str(stranger))
    assert code == 2 and "not a spectool build" in err


# Speculation pays up to concurrency 8 (k=4 up to 4, k=2 at 5-8) and not at 32.
STEPPED = {1: 4, 4: 4, 8: 2, 32: 0}
CUTOFF = {1: 4, 16: 4, 64: 0}


@pytest.mark.parametrize(
    ("version", "schedule", "inert", "expected", "note"),
    [
        # eagle3 is one-model by default: 1.1/1.2 ignore its gate (issue 15), so build either
        # writes none and lets serve's cost gate pick the baseline, or goes two-model.
        ("1.2.1", STEPPED, "serve", {}, "chose no runtime gate"),
        ("1.2.1", STEPPED, "two-model", {"draft_len_schedule": {1: 4, 5: 2, 9: 0}}, "two-model"),
        ("1.3.0rc24", STEPPED, "serve", {"draft_len_schedule": {4: 4, 8: 2}}, None),
        ("1.1.0", STEPPED, "two-model", {"max_concurrency": 8}, "two-model"),
        ("1.1.0", STEPPED, "serve", {}, "chose no runtime gate"),
        ("1.0.0", STEPPED, "two-model", {}, "cannot switch speculation off"),
        ("1.2.1", CUTOFF, "two-model", {"max_concurrency": 16}, "two-model"),
        ("1.3.0rc24", CUTOFF, "serve", {"max_concurrency": 16}, None),
    ],
)
def test_decision_becomes_the_release_runtime_gate(
    make_ckpt, tmp_path, capsys, version, schedule, inert, expected, note
) -> None:
    decision = write_decision(tmp_path / "decision.json", schedule)
    out = tmp_path / "b"
    code, stdout, err = build(
        capsys,
        *_pair(make_ckpt),
        "--gpu",
        "h100-sxm",
        "--trtllm-version",
        version,
        "--decision",
        str(decision),
        "--inert-gate",
        inert,
        "--out",
        str(out),
    )
    assert code == 0, stdout + err
    spec = yaml.safe_load((out / "speculative.yaml").read_text())["speculative_config"]
    gate = {k: spec[k] for k in ("draft_len_schedule", "max_concurrency") if k in spec}
    assert gate == expected
    two_model = bool(expected) and inert == "two-model"
    assert spec.get("eagle3_one_model") is (False if two_model else None)
    m = json.loads((out / "manifest.json").read_text())
    assert m["decision"]["sha256"] == sha(decision) == m["files"]["decision.json"]
    assert m["decision"]["schedule"] == {str(c): k for c, k in schedule.items()}
    off_above = max(c for c, k in schedule.items() if k)
    path = "two_model" if two_model else "one_model"
    assert m["runtime_gate"] == (
        {"kind": next(iter(expected)), "off_above": off_above, "drafter_path": path}
        if expected
        else None
    )
    assert (note is None) == (not m["notes"]) and (note is None or note in m["notes"][0])
    if expected:  # every schedule key lands on a captured CUDA graph
        graphs = set(
            yaml.safe_load((out / "speculative.yaml").read_text())["cuda_graph_config"][
                "batch_sizes"
            ]
        )
        assert set(spec.get("draft_len_schedule", {off_above: 0})) <= graphs


def test_decision_draft_length_must_agree(make_ckpt, tmp_path, capsys) -> None:
    decision = write_decision(tmp_path / "decision.json", STEPPED)
    code, _, err = build(
        capsys,
        *_pair(make_ckpt),
        "--gpu",
        "h100-sxm",
        "--decision",
        str(decision),
        "--max-draft-len",
        "3",
        "--out",
        str(tmp_path / "b"),
    )
    assert code == 2 and "--max-draft-len" in err
    other = write_decision(tmp_path / "ngram.json", STEPPED, method="draft_model")
    code, _, err = build(
        capsys,
        *_pair(make_ckpt),
        "--gpu",
        "h100-sxm",
        "--decision",
        str(other),
        "--out",
        str(tmp_path / "b"),
    )
    assert code == 2 and "measured method draft_model" in err


def test_torch_engine_build_records_the_embedded_engine_config(tiny_pair, tmp_path, capsys) -> None:
    target, drafter = tiny_pair
    decision = write_decision(
        tmp_path / "d.json", {1: 3, 4: 3, 16: 0}, method="draft_model", engine="torch"
    )
    out = tmp_path / "b"
    code, stdout, err = build(
        capsys,
        str(target),
        str(drafter),
        "--engine",
        "torch",
        "--decision",
        str(decision),
        "--max-batch-size",
        "8",
        "--out",
        str(out),
    )
    assert code == 0, stdout + err
    spec = json.loads((out / "speculative.json").read_text())
    base = json.loads((out / "baseline.json").read_text())
    assert spec == {  # the gate that applies, no null beside it
        "method": "draft_model",
        "max_draft_len": 3,
        "max_concurrency": 4,
        "max_batch_size": 8,
        "max_seq_len": 512,
    }
    assert base == {"method": "none", "max_batch_size": 8, "max_seq_len": 512}  # no draft length
    m = json.loads((out / "manifest.json").read_text())
    assert (m["engine"], m["trtllm"], m["runtime_gate"]) == (
        "torch",
        None,
        {"kind": "max_concurrency", "off_above": 4, "drafter_path": None},
    )
    serve, serve_base = m["commands"]["serve"], m["commands"]["serve_baseline"]
    assert serve[:4] == ["spectool", "serve", str(target), str(drafter)]
    # the server reads the build's files themselves (the gate is in them), no flag round trip
    assert serve[serve.index("--engine-config") + 1] == str(out.resolve() / "speculative.json")
    assert serve_base[serve_base.index("--engine-config") + 1] == str(
        out.resolve() / "baseline.json"
    )
    assert str(drafter) not in serve_base and "--method" not in serve + serve_base


def test_gpu_is_required_for_tensorrt_llm_builds() -> None:
    with pytest.raises(BadInputError, match="no NVIDIA GPU found") as exc:
        resolve_build_gpu("auto", "trtllm", detected=[])
    assert exc.value.where == "--gpu" and "h100" in exc.value.problem.lower()
    assert resolve_build_gpu("auto", "torch", detected=[]).spec is None
    h100 = DetectedGpu(
        0, "NVIDIA H100 80GB HBM3", 81559 * 2**20, 90, "550.54", load_gpu("h100-sxm")
    )
    assert resolve_build_gpu(None, "trtllm", detected=[h100]).spec.name == "H100 SXM"
    odd = DetectedGpu(0, "NVIDIA Mystery 9000", 10 * 2**30, 95, "600.1", None)
    with pytest.raises(BadInputError, match="Mystery 9000"):
        resolve_build_gpu("auto", "trtllm", detected=[odd])
    assert resolve_build_gpu("h200", "trtllm", detected=[odd]).spec.name == "H200 SXM"


def _fake_tool(folder: Path, name: str) -> None:
    """A file named like an absent tool, so PATH lookup succeeds; build only records its argv."""
    path = folder / name
    path.write_text("#!/bin/sh\nexit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_legacy_tensorrt_backend(make_ckpt, tmp_path, capsys, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    out = tmp_path / "b"
    argv = [
        *_pair(make_ckpt, EAGLE1),
        "--method",
        "eagle",
        "--trtllm-backend",
        "tensorrt",
        "--trtllm-version",
        "1.2.1",
        "--gpu",
        "h100-sxm",
        "--out",
        str(out),
    ]
    code, _, err = build(capsys, *argv)
    assert code == 2 and "trtllm-build not found" in err and "tensorrt-llm" in err
    assert not out.exists()
    _fake_tool(bin_dir, "trtllm-build")
    code, _, err = build(capsys, *argv)  # no convert_checkpoint.py here: recorded, not run
    assert code == 2 and "convert_checkpoint.py not found" in err
    m = json.loads((out / "manifest.json").read_text())
    steps = {s["name"]: s["argv"] for s in m["engine_build"]["steps"]}
    assert m["engine_build"]["runnable"] is False
    build_spec = steps["trtllm-build speculative engine"]
    assert build_spec[0] == str(bin_dir / "trtllm-build")
    assert build_spec[build_spec.index("--speculative_decoding_mode") + 1] == "eagle"
    assert "--max_draft_len" not in build_spec  # EAGLE-1: the tree is the checkpoint's
    assert build_spec[build_spec.index("--output_dir") + 1] == str(out / "engine")
    convert = steps["convert speculative checkpoint"]
    assert convert[1].endswith("eagle/convert_checkpoint.py")
    assert convert[convert.index("--eagle_model_dir") + 1] == str(make_ckpt(EAGLE1))
    # examples/eagle/README.md: a 63-token tree of depth 4, whatever --max-draft-len says
    assert convert[convert.index("--max_draft_len") + 1] == "63"
    assert convert[convert.index("--num_eagle_layers") + 1] == "4"
    assert "--speculative_decoding_mode" not in steps["trtllm-build baseline engine"]
    assert steps["convert baseline checkpoint"][1].endswith(
        "models/core/llama/convert_checkpoint.py"
    )
    spec = yaml.safe_load((out / "speculative.yaml").read_text())
    assert spec["speculative_config"]["decoding_type"] == "Eagle"
    assert m["commands"]["serve"][1] == str(out / "engine")  # trtllm-serve ENGINE --tokenizer T
    assert m["commands"]["serve"][m["commands"]["serve"].index("--tokenizer") + 1] == str(
        make_ckpt(LLAMA)
    )
    # With the examples folder the steps are found (running them needs TensorRT-LLM and a GPU).
    examples = tmp_path / "examples"
    for sub in ("eagle", "models/core/llama"):
        (examples / sub).mkdir(parents=True)
        (examples / sub / "convert_checkpoint.py").write_text("")
    request = BuildRequest(
        target=str(make_ckpt(LLAMA)),
        drafter=str(make_ckpt(EAGLE1)),
        method="eagle",
        trtllm_backend="tensorrt",
        trtllm_version="1.2.1",
        gpu="h100-sxm",
        out=out,
        trtllm_examples=examples,
    )
    plan = plan_build(check_build(request))
    assert plan.steps_runnable and plan.steps[0].argv[1] == str(
        examples / "eagle" / "convert_checkpoint.py"
    )
    assert os.environ["PATH"] == str(bin_dir)


def test_local_drafter_for_releases_that_cannot_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TensorRT-LLM 1.0/1.1 load a draft model from a folder only (PR #10099): a local folder
    passes, a repo id is refused with the command to run, and ``--download`` resolves it
    through huggingface_hub (here from the local Hub cache, offline)."""
    import dataclasses
    from types import SimpleNamespace

    import huggingface_hub.constants as hf_constants

    from spectool.deploy.render import local_drafter

    folder = tmp_path / "drafter"
    folder.mkdir()
    request = BuildRequest()
    plain = SimpleNamespace(revision=None)
    assert local_drafter(str(folder), plain, "1.1", request) == str(folder)
    with pytest.raises(BadInputError, match="huggingface-cli download org/tiny-drafter"):
        local_drafter("org/tiny-drafter", plain, "1.1", request)
    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = cache / "models--org--tiny-drafter" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--org--tiny-drafter" / "refs").mkdir()
    (cache / "models--org--tiny-drafter" / "refs" / "main").write_text(commit)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    download = dataclasses.replace(request, download=True)
    assert Path(local_drafter("org/tiny-drafter", plain, "1.1", download)) == snapshot
    with pytest.raises(BadInputError, match="cannot download org/missing"):
        local_drafter("org/missing", plain, "1.1", download)
