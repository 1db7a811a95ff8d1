"""Profiles' geometry/acceptance blocks, check's "will it pay" section (offline from a profile)
and ``tune --predict-only`` -> ``build --decision`` -> serve's cost gate on the demo pair."""

from __future__ import annotations

import importlib.util
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from ckpt_factory import build_checkpoint
from pydantic import ValidationError

from spectool import profiles
from spectool.cli.app import main
from spectool.deploy.launch import prepare_serve
from spectool.deploy.machine import MachineFacts
from spectool.profiles import PublishedAcceptance

ROOT = Path(__file__).resolve().parent.parent
GEOMETRY_SOURCES = {  # profile -> how scripts/profile_geometry.py computes its block
    "llama-3.1-8b-eagle3": ("published", "llama-3.1-8b-instruct", "eagle3-llama3.1-8b"),
    "llama-3.3-70b-eagle3": ("published", "llama-3.3-70b-instruct", "eagle3-llama3.3-70b"),
    "llama-3.1-405b-eagle3": ("published", "llama-3.1-405b-instruct", "eagle3-llama3.1-405b-own"),
    "deepseek-r1-mtp": ("published", "deepseek-r1"),
    "deepseek-v3-mtp": ("published:fp8", "deepseek-r1"),  # DeepSeek-V3 ships FP8 weights
    "qwen3-8b-ngram": ("published", "qwen3-8b"),
    "demo": ("checkpoint", "spectool:demo-target-mtp", "spectool:demo-drafter"),
}


def _script():
    spec = importlib.util.spec_from_file_location("pg", ROOT / "scripts" / "profile_geometry.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(GEOMETRY_SOURCES))
def test_profile_geometry_is_what_the_real_configs_give(name: str) -> None:
    pg = _script()
    kind, *refs = GEOMETRY_SOURCES[name]
    kind, _, precision = kind.partition(":")
    dtype = precision or ("bf16" if kind == "published" else "fp16")

    def read(ref: str):  # noqa: ANN202
        if kind == "published":
            return pg.published_geometry(ref, dtype)
        return pg.checkpoint_geometry(ref)

    geometry = profiles.load_profile(name).geometry
    assert geometry is not None
    blocks = [geometry.target, geometry.drafter][: len(refs)]
    for ref, block in zip(refs, blocks, strict=True):
        assert block is not None
        assert block.model_dump(exclude_none=True, exclude_defaults=True) == {
            k: v for k, v in pg.spec_of(read(ref), dtype).items() if v or k == "embedding_params"
        }


def test_llama_eagle3_profile_is_complete() -> None:
    recipe = profiles.load_profile("llama-3.1-8b-eagle3")
    assert recipe.geometry is not None and recipe.geometry.drafter is not None
    assert recipe.geometry.target.num_layers == 32 and recipe.geometry.drafter.num_layers == 1
    assert recipe.acceptance is not None and recipe.acceptance.source.startswith("https://")
    acc = recipe.acceptance.to_acceptance()
    assert acc.tokens_per_step(3) == pytest.approx(2.79, abs=1e-6)


def test_published_acceptance_needs_exactly_one_figure() -> None:
    with pytest.raises(ValidationError, match="exactly one"):
        PublishedAcceptance(length=2.0, rate=0.5, draft_len=3, source="https://x.org", notes="n")
    with pytest.raises(ValidationError, match="exceeds draft_len"):
        PublishedAcceptance(length=5.0, draft_len=3, source="https://x.org", notes="n")
    with pytest.raises(ValidationError, match="draft_len"):
        PublishedAcceptance(length=2.0, source="https://x.org", notes="n")


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))


def test_check_offline_predicts_from_the_profile(offline: None, capsys) -> None:
    argv = ["check", "llama-3.1-8b-eagle3", "--gpu", "h100-sxm", "--concurrency", "1,8,64"]
    assert main([*argv, "--json"]) == 3  # unverified: no headers, prediction still given
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "unverified" and report["target"] is None
    # the release's rules for the method still run offline (here: 1.2 ignores the gate)
    assert [f["code"] for f in report["findings"]] == ["HEADERS_UNAVAILABLE", "TRTLLM_GATE_INERT"]
    message = report["findings"][0]["message"]
    assert "engine support rules" in message and "memory estimate" not in message
    assert "memory per rank from the profile's geometry" in message  # offline, from sizes
    memory = report["memory"]  # one GPU: the estimate, no per-rank table (as with headers)
    assert memory["sequences_with_drafter"] > 0 and memory["per_rank"] == []
    pays = report["will_it_pay"]
    assert pays["predicted"] is True and pays["hardware"] == "H100 SXM"
    assert "vllm-project/vllm/issues/20780" in pays["acceptance"]["source"]
    assert pays["factors"].startswith("engine default (trtllm)")
    assert pays["geometry"].startswith("profile llama-3.1-8b-eagle3")
    rows = pays["concurrency"]
    assert [r["concurrency"] for r in rows] == [1, 8, 64]
    for row in rows:
        best = next(k for k in row["ks"] if k["k"] == row["best_k"])
        assert best["speedup"] > 1.0 and best["speedup"] == max(k["speedup"] for k in row["ks"])
    assert "break_even_concurrency" in pays
    assert main(argv) == 3
    text = capsys.readouterr().out
    assert "will it pay" in text and "predicted, not measured" in text
    assert "c=8: speculation pays" in text and "published: https://github.com" in text


def test_check_without_acceptance_gives_break_even_lengths(offline: None, capsys) -> None:
    assert main(["check", "deepseek-v3-mtp", "--gpu", "h200", "--tp", "8", "--json"]) == 3
    pays = json.loads(capsys.readouterr().out)["will_it_pay"]
    assert pays["acceptance"] is None and pays["break_even_concurrency"] is None
    for line in pays["lines"]:
        assert "speculation pays if at least" in line
    be = [min(k["break_even_tokens_per_step"] for k in r["ks"]) for r in pays["concurrency"]]
    assert all(1.0 < b < 9.0 for b in be)


def test_check_acceptance_flags_change_the_prediction(capsys) -> None:
    base = ["check", "demo", "--gpu", "h100-sxm", "--concurrency", "8", "--json"]
    assert main([*base, "--acceptance-length", "1.5"]) == 0
    low = json.loads(capsys.readouterr().out)["will_it_pay"]
    assert main([*base, "--acceptance-length", "4.0"]) == 0
    high = json.loads(capsys.readouterr().out)["will_it_pay"]
    best = lambda p: max(k["speedup"] for k in p["concurrency"][0]["ks"])  # noqa: E731
    assert best(high) > best(low)
    assert "--acceptance-length 4" in high["acceptance"]["source"]
    assert main([*base, "--acceptance-length", "2", "--acceptance-rate", "0.5"]) == 2
    assert "give one acceptance input" in capsys.readouterr().err


def test_check_prints_the_interval_and_an_uncertain_verdict(capsys) -> None:
    """Issue 23: every predicted speed-up carries its 80 % interval; a verdict whose interval
    straddles 1 says `uncertain`, never `pays`."""
    from spectool.predict.interval import HIGH_FACTOR, LOW_FACTOR

    base = ["check", "demo", "--gpu", "h100-sxm", "--concurrency", "8"]
    assert main([*base, "--acceptance-length", "1.5", "--json"]) == 0
    pays = json.loads(capsys.readouterr().out)["will_it_pay"]
    row = pays["concurrency"][0]
    best = next(k for k in row["ks"] if k["k"] == row["best_k"])
    low, high = best["speedup_interval"]
    assert low == pytest.approx(best["speedup"] * LOW_FACTOR)
    assert high == pytest.approx(best["speedup"] * HIGH_FACTOR)
    assert low < 1.0 < high and row["verdict"] == "uncertain"
    assert pays["interval"]["level"] == 0.8
    assert main([*base, "--acceptance-length", "1.5"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "c=8: speculation is uncertain" in text
    assert f"({low:.2f}-{high:.2f})" in text and "80% interval" in text
    assert main([*base, "--acceptance-length", "4.0", "--json"]) == 0
    sure = json.loads(capsys.readouterr().out)["will_it_pay"]["concurrency"][0]
    assert sure["verdict"] == "pays"


def test_predict_only_writes_a_predicted_decision_build_and_gate(tmp_path: Path, capsys) -> None:
    out = tmp_path / "pred"
    argv = ["tune", "--predict-only", "--concurrency", "1,2,8", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "predicted, not measured" in text and "CPU probe" in text
    assert "80% interval" in " ".join(text.split())  # each speed-up with its interval
    decision = json.loads((out / "decision.json").read_text())
    for key in ("engine", "method", "max_draft_len", "schedule", "draft_len_schedule", "cells"):
        assert key in decision
    assert decision["predicted"] is True and decision["engine"] == "torch"
    assert "README.md" in decision["prediction"]["acceptance"]
    assert decision["prediction"]["calibration"].startswith("CPU probe")
    assert {c["source"] for c in decision["cells"]} == {"predicted"}
    for c in decision["cells"]:  # the ratio's 80 % interval; straddling 1 is inconclusive
        assert c["ci_low"] < c["ratio"] < c["ci_high"]
        pays, loses = c["ci_high"] < 1.0, c["ci_low"] > 1.0
        assert c["verdict"] == ("pays" if pays else "does_not_pay" if loses else "inconclusive")
    assert set(decision["schedule"]) == {"1", "2", "8"}
    assert (out / "speculative.json").is_file() and (out / "manifest.json").is_file()
    assert main(argv) == 2  # an earlier decision is not replaced without --force
    assert "--force" in capsys.readouterr().err
    build = tmp_path / "b"
    assert main(["build", "--decision", str(out / "decision.json"), "--engine", "torch",
                 "--out", str(build)]) == 0  # fmt: skip
    assert "predicted, not measured" in capsys.readouterr().out
    manifest = json.loads((build / "manifest.json").read_text())
    assert manifest["decision"]["predicted"] is True
    plan = prepare_serve(out, facts=MachineFacts((), None, None), port=9000)
    assert plan.gate.predicted and plan.gate.reason.startswith("predicted, not measured")


def test_predict_only_refuses_without_acceptance(tmp_path: Path, capsys) -> None:
    argv = ["tune", "spectool:demo-target", "spectool:demo-drafter", "--predict-only"]
    assert main([*argv, "--out", str(tmp_path / "x")]) == 2
    assert "a schedule needs acceptance" in capsys.readouterr().err
    assert not (tmp_path / "x" / "decision.json").exists()


@pytest.fixture(scope="module")
def llama_eagle3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The real Llama-3.1-8B + EAGLE-3 headers (sparse files: no disk, no weights)."""
    root = tmp_path_factory.mktemp("pair")
    target = build_checkpoint("meta-llama/Llama-3.1-8B-Instruct", root / "t")
    drafter = build_checkpoint("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", root / "e")
    return target, drafter


def test_check_reads_geometry_from_headers_and_agrees_with_the_profile(
    llama_eagle3: tuple[Path, Path], offline: None, capsys
) -> None:
    target, drafter = llama_eagle3
    flags = ["--gpu", "h100-sxm", "--concurrency", "1,64", "--acceptance-length", "2.79"]
    flags += ["--max-draft-len", "3", "--json"]
    assert main(["check", str(target), str(drafter), *flags]) == 0
    headers = json.loads(capsys.readouterr().out)["will_it_pay"]
    assert headers["geometry"] == "checkpoint headers"
    assert main(["check", "llama-3.1-8b-eagle3", *flags]) == 3
    profile = json.loads(capsys.readouterr().out)["will_it_pay"]
    assert profile["geometry"].startswith("profile llama-3.1-8b-eagle3")
    for h, p in zip(headers["concurrency"], profile["concurrency"], strict=True):
        assert h["best_k"] == p["best_k"]
        assert h["base_step_ms"] == pytest.approx(p["base_step_ms"], rel=0.01)
        for hk, pk in zip(h["ks"], p["ks"], strict=True):
            assert hk["speedup"] == pytest.approx(pk["speedup"], rel=0.01)


def test_predict_only_on_trtllm_uses_the_gpu_defaults(
    llama_eagle3: tuple[Path, Path], tmp_path: Path, capsys
) -> None:
    target, drafter = llama_eagle3
    out = tmp_path / "t"
    argv = ["tune", str(target), str(drafter), "--engine", "trtllm", "--gpu", "h100-sxm"]
    argv += ["--predict-only", "--acceptance-rate", "0.7", "--concurrency", "1,8,64"]
    assert main([*argv, "--max-draft-len", "4", "--out", str(out)]) == 0
    assert "predicted, not measured" in capsys.readouterr().out
    decision = json.loads((out / "decision.json").read_text())
    assert decision["engine"] == "trtllm" and decision["method"] == "eagle3"
    assert decision["prediction"]["hardware"] == "H100 SXM"
    assert decision["prediction"]["calibration"].startswith("engine default (trtllm)")
    assert decision["prediction"]["acceptance"] == "--acceptance-rate 0.7"
    assert 1 <= decision["max_draft_len"] <= 4 and decision["schedule"]["1"] >= 1
    assert (out / "speculative.yaml").is_file() and (out / "baseline.yaml").is_file()


def test_predict_only_takes_acceptance_from_an_earlier_run(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    raw = {
        "iterations": [],
        "positions": {"accepted_per_pos": [90, 60], "reached_per_pos": [100, 90]},
    }
    (run / "tune.json").write_text(
        json.dumps({"format": "spectool.tune/1", "cells": [{"concurrency": 1, "k": 2, "raw": raw}]})
    )
    out = tmp_path / "p"
    argv = ["tune", "--predict-only", "--acceptance-from", str(run), "--concurrency", "1"]
    assert main([*argv, "--out", str(out), "--json"]) == 0
    decision = json.loads(capsys.readouterr().out)
    assert "tune" in decision["prediction"]["acceptance"]
    assert {c["k"] for c in decision["cells"]} == {1, 2}  # measured up to k=2: no k=3, 4 cells
    assert main(["tune", "--acceptance-rate", "0.5", "--out", str(tmp_path / "m")]) == 2
    assert "--predict-only" in capsys.readouterr().err


def test_predicted_build_serves_one_request_and_says_predicted(tmp_path: Path) -> None:
    """tune --predict-only -> spectool serve DIR: start, one request, SIGTERM; the cost gate's
    line on stderr says the decision is predicted, not measured."""
    out = tmp_path / "pred"
    assert main(["tune", "--predict-only", "--concurrency", "1,2", "--out", str(out)]) == 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stdout, stderr = tmp_path / "out", tmp_path / "err"
    cmd = [sys.executable, "-m", "spectool.cli.app", "serve", str(out), "--port", str(port)]
    cmd += ["--expected-concurrency", "1"]
    server = subprocess.Popen(cmd, stdout=stdout.open("wb"), stderr=stderr.open("wb"))
    try:
        end = time.monotonic() + 120
        while "ready after" not in stdout.read_text(errors="replace"):
            assert server.poll() is None, stderr.read_text()
            assert time.monotonic() < end, "server not ready in 120 s"
            time.sleep(0.2)
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            timeout=30.0,
            json={"prompt": "def f(", "max_tokens": 4, "ignore_eos": True},
        )
        assert response.json()["usage"]["completion_tokens"] == 4
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    log = stderr.read_text()
    assert "predicted, not measured" in log and "speculative.json" in log
