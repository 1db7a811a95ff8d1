"""Issue 15's done-when: for 1.0, 1.1, 1.2 and main x {eagle3 one-/two-model, mtp, draft_model,
ngram}, ``spectool build`` and ``serve --speculation auto`` never rely on a gate the release
ignores. Each combination is built, planned by serve's cost gate and run on the trtllm-serve
double, which applies a gate only where that release does."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import free_port

from spectool.cli.app import main
from spectool.deploy.launch import prepare_serve
from spectool.deploy.machine import MachineFacts
from spectool.gpu import DetectedGpu
from spectool.profiles import load_gpu
from spectool.trtllm.gates import gate_support

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
PAIRS = {
    "eagle3": (LLAMA, "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),
    "draft_model": (LLAMA, "meta-llama/Llama-3.2-1B-Instruct"),
    "mtp": ("deepseek-ai/DeepSeek-V3", None),
    "ngram": (LLAMA, None),
}
VERSIONS = {"1.0": "1.0.0", "1.1": "1.1.0", "1.2": "1.2.1", "main": "1.3.0rc24"}
VARIANTS = ["eagle3 one-model", "eagle3 two-model", "mtp", "draft_model", "ngram"]
SCHEDULE = {1: 2, 8: 2, 64: 0}  # pays up to concurrency 8, not at 64
HEAVY = 64


def _decision(path: Path, method: str) -> Path:
    cells = [
        {
            "concurrency": c,
            "k": k or 1,
            "lhs_ms_per_token": 6.0 if k else 11.5,
            "rhs_ms_per_token": 10.0,
            "ratio": 0.6 if k else 1.15,
            "ci_low": 0.56 if k else 1.11,
            "ci_high": 0.64 if k else 1.19,
            "verdict": "pays" if k else "does_not_pay",
        }
        for c, k in SCHEDULE.items()
    ]
    doc = {
        "engine": "tensorrt-llm",
        "method": method,
        "max_draft_len": 2,
        "searched_max_draft_len": 4,
        "schedule": {str(c): k for c, k in SCHEDULE.items()},
        "break_even_concurrency": 64,
        "cells": cells,
        "runs": {"used": 6, "full_grid": 12},
    }
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("release", list(VERSIONS))
def test_build_and_serve_never_rely_on_an_inert_gate(
    release, variant, make_ckpt, trtllm_serve, tmp_path, capsys, monkeypatch
):
    method = variant.split()[0]
    two_model = variant.endswith("two-model")
    target, drafter = PAIRS[method]
    gpu, tp = ("h200", 8) if method == "mtp" else ("h100-sxm", 1)
    out = tmp_path / "build"
    argv = ["build", str(make_ckpt(target))]
    argv += [str(make_ckpt(drafter))] if drafter else (["self"] if method == "mtp" else [])
    argv += ["--method", method, "--gpu", gpu, "--tp", str(tp), "--max-batch-size", "128"]
    argv += ["--trtllm-version", VERSIONS[release], "--out", str(out)]
    argv += ["--decision", str(_decision(tmp_path / "d.json", method))]
    argv += ["--inert-gate", "two-model" if two_model else "serve"]
    code = main(argv)
    stdout, err = capsys.readouterr()
    assert code == 0, stdout + err
    manifest = json.loads((out / "manifest.json").read_text())
    spec = yaml.safe_load((out / "speculative.yaml").read_text())
    base = yaml.safe_load((out / "baseline.yaml").read_text())
    # Fair graphs: the same coverage in both configs, recorded in the manifest.
    assert spec["cuda_graph_config"] == base["cuda_graph_config"]
    assert spec["cuda_graph_config"]["enable_padding"] is True
    assert manifest["limits"]["cuda_graph_padding"] is True
    # build: a gate is written only where the table says the release honours it.
    written = manifest["runtime_gate"]
    path_two = written is not None and written["drafter_path"] == "two_model"
    support = gate_support(release, method, two_model=path_two)
    assert written is None or support.honours(written["kind"])
    if written is None:
        assert any("cost gate picks baseline.yaml" in n for n in manifest["notes"]), manifest
    # serve --speculation auto at a load above break-even, run on the double.
    spectool_gpu = load_gpu(gpu)
    facts = MachineFacts(
        tuple(
            DetectedGpu(
                i,
                spectool_gpu.name,
                int(spectool_gpu.memory_gib * 2**30),
                spectool_gpu.sm,
                "570",
                spectool_gpu,
            )
            for i in range(tp)
        ),
        VERSIONS[release],
        None,
    )
    port = free_port()
    plan = prepare_serve(
        out,
        expected_concurrency=HEAVY,
        host="127.0.0.1",
        port=port,
        facts=facts,
        trtllm_serve=str(trtllm_serve),
    )
    assert plan.gate.speculate == (written is not None), plan.gate.reason
    monkeypatch.setenv("TRTLLM_DOUBLE_RELEASE", release)
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(list(plan.command.argv), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                _get(f"http://127.0.0.1:{port}/health")
                break
            except OSError:
                assert time.monotonic() < deadline, "double not healthy"
                time.sleep(0.1)
        heavy = _get(f"http://127.0.0.1:{port}/double/draft_len?batch={HEAVY}")
        light = _get(f"http://127.0.0.1:{port}/double/draft_len?batch=1")
        assert heavy == {"draft_len": 0}  # no speculation above break-even, whatever was served
        assert light == {"draft_len": 2 if plan.gate.speculate else 0}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
