"""``spectool serve --engine torch``: option checks (exit 2) and a real server process."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from spectool.cli.app import main
from spectool.cli.serve import torch_serve_request

START_DEADLINE_S = 90.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--engine", "vllm"], "--engine"),
        (["--engine", "trtllm"], "--engine trtllm"),
        (["--method", "eagle3"], "--method"),
        (["/no/such/folder"], "/no/such/folder"),
        (["--port", "70000"], "--port"),
    ],
)
def test_bad_options_exit_2_with_one_line(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("spectool: error:") and needle in err
    assert "\n" not in err


def test_method_and_drafter_must_agree(
    target_dir: Path, drafter_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", str(target_dir), str(drafter_dir), "--method", "ngram"]) == 2
    assert main(["serve", str(target_dir), "--method", "draft_model"]) == 2
    assert "DRAFTER" in capsys.readouterr().err


def test_busy_port_is_bad_input(target_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        assert main(["serve", str(target_dir), "--port", str(port), "--device", "cpu"]) == 2
    assert f"127.0.0.1:{port}" in capsys.readouterr().err


def test_request_resolution(target_dir: Path, drafter_dir: Path) -> None:
    request = torch_serve_request(str(target_dir), str(drafter_dir), max_draft_len=2)
    assert (request.target, request.drafter) == (target_dir.resolve(), drafter_dir.resolve())
    assert (request.method, request.max_draft_len) == ("draft_model", 2)
    assert request.model_name == target_dir.name
    assert request.host == "127.0.0.1"
    plain = torch_serve_request(str(target_dir), None, served_model_name="m")
    assert (plain.method, plain.drafter, plain.model_name) == ("none", None, "m")


def test_no_target_serves_the_embedded_demo_pair() -> None:
    request = torch_serve_request(None, None)
    assert (request.target.name, request.method) == ("demo-target", "draft_model")
    assert request.drafter is not None and request.drafter.name == "demo-drafter"
    alone = torch_serve_request(None, None, method="ngram")
    assert (alone.target.name, alone.drafter) == ("demo-target", None)


def test_serve_process_answers_then_stops_on_sigint(target_dir: Path, drafter_dir: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "spectool.cli.app", "serve", str(target_dir), str(drafter_dir)]
    argv += ["--port", str(port), "--device", "cpu", "--max-seq-len", "256"]
    argv += ["--max-draft-len", "2", "--served-model-name", "tiny", "--log-level", "info"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + START_DEADLINE_S
        status = None
        while time.monotonic() < end and status != 200:
            assert process.poll() is None, process.communicate()[1]
            try:
                status = httpx.get(f"{url}/health", timeout=2.0).status_code
            except httpx.TransportError:
                status = None
            time.sleep(0.05)
        assert status == 200
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "tiny"
        response = httpx.post(
            f"{url}/v1/completions",
            json={"model": "tiny", "prompt": "hello", "max_tokens": 3, "ignore_eos": True},
            timeout=30.0,
        )
        assert response.status_code == 200
        assert response.json()["usage"]["completion_tokens"] == 3
        metrics = httpx.get(f"{url}/metrics").json()
        assert metrics and all("specDecodingStats" in m for m in metrics)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130  # interrupted, after a graceful shutdown
    assert "serving tiny" in err and f"listening on http://127.0.0.1:{port}" in err
    assert "model tiny loaded" in err and "Application shutdown complete" in err


def test_a_model_that_fails_to_load_stops_the_server_with_its_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty-model"
    empty.mkdir()
    argv = ["serve", str(empty), "--port", "0", "--device", "cpu", "--log-level", "error"]
    assert main(argv) == 2  # the CheckpointError raised on the loader thread, re-raised
    assert "config.json" in capsys.readouterr().err
