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
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err
    assert "serving" not in err and err.count("\n") == 1  # no "serving" line before the error


def test_no_arguments_say_which_engine_and_model_and_why() -> None:
    with socket.socket() as blocker:  # a busy port: the command stops right after choosing
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "spectool.cli.app", "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    error = lines[-1]
    # the note, wrapped between words at 80 columns (continuation lines indented)
    assert all(len(line) <= 80 for line in lines[:-1])
    assert all(line.startswith("  ") for line in lines[1:-1])
    note = " ".join(line.strip() for line in lines[:-1])
    assert "no TARGET given" in note and "spectool:demo-target + spectool:demo-drafter" in note
    assert "embedded torch engine" in note and "TensorRT-LLM serves build folders" in note
    assert "for measuring speed, not for answers" in note  # the demo says what it is
    assert error.startswith("spectool: error:") and str(port) in error


def _busy_port_serve(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """stderr of ``serve ARGV`` on a busy port: everything said before the server would start."""
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        assert main(["serve", *argv, "--port", str(port), "--device", "cpu"]) == 2
    return " ".join(capsys.readouterr().err.split())


def test_the_demo_says_what_it_is_once_at_start_up(
    target_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in ([], ["spectool:demo-target"], ["spectool:demo-target", "spectool:demo-drafter"]):
        said = _busy_port_serve(argv, capsys)
        assert said.count("tiny model trained on Python standard-library code") == 1, said
        assert "for measuring speed, not for answers" in said and "lines like '#'" in said
    assert "not for answers" not in _busy_port_serve([str(target_dir)], capsys)


def test_the_demo_says_what_it_is_in_v1_models(
    target_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fastapi.testclient import TestClient

    import spectool.server.run as run
    from spectool.server.app import create_app

    served: list[dict] = []

    def record(*_args: object, **kwargs: object) -> None:
        served.append(kwargs)

    monkeypatch.setattr(run, "serve_checkpoint", record)
    for argv in (["spectool:demo-target"], [str(target_dir)]):
        assert main(["serve", *argv, "--port", "0", "--device", "cpu"]) == 0
    capsys.readouterr()
    demo, other = (kwargs["description"] for kwargs in served)
    assert "for measuring speed, not for answers" in demo and other is None

    def unloadable() -> None:
        raise RuntimeError("not loaded in this test")

    for description in (demo, other):
        app = create_app(unloadable, model_name="demo-target", description=description)
        with TestClient(app) as client:
            card = client.get("/v1/models").json()["data"][0]
        assert card["id"] == "demo-target" and card.get("description") == description
        assert ("description" in card) == (description is not None)


def test_a_folder_that_is_neither_build_nor_model_is_refused_before_serving(
    tmp_path: Path, make_ckpt, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "readme.txt").write_text("not a model")
    assert main(["serve", str(notes), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "neither a build folder" in err and "serving" not in err
    head = make_ckpt("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    assert main(["serve", str(head), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "EAGLE-3 head" in err


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


def test_serve_runs_the_demo_targets_own_mtp_module() -> None:
    """``spectool serve spectool:demo-target-mtp self --engine torch``: the embedded engine
    drafts with the target's MTP module (``self``), answers with tokens and reports MTP
    drafts accepted in /metrics; a target without MTP layers is refused in one line first."""
    request = torch_serve_request("spectool:demo-target-mtp", "self")
    assert (request.method, request.drafter) == ("mtp", None)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "spectool.cli.app", "serve", "spectool:demo-target-mtp", "self"]
    argv += ["--engine", "torch", "--port", str(port), "--device", "cpu", "--max-seq-len", "256"]
    argv += ["--max-draft-len", "2", "--served-model-name", "mtp", "--log-level", "warning"]
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
        body = {"model": "mtp", "prompt": "def main(argv):\n    ", "max_tokens": 24}
        response = httpx.post(
            f"{url}/v1/completions", json={**body, "ignore_eos": True}, timeout=60
        )
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 24
        metrics = httpx.get(f"{url}/metrics").json()
        spec = [m["specDecodingStats"] for m in metrics if "specDecodingStats" in m]
        assert spec and sum(s["numDraftTokens"] for s in spec) > 0
        assert sum(s["numAcceptedTokens"] for s in spec) > 0  # the trained module is accepted
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130
    assert "mtp" in err


def test_serving_mtp_needs_a_target_with_mtp_layers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "spectool:demo-target", "self", "--engine", "torch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "declares no MTP layers" in err


def test_a_model_that_fails_to_load_stops_the_server_with_its_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty-model"
    empty.mkdir()
    argv = ["serve", str(empty), "--port", "0", "--device", "cpu", "--log-level", "error"]
    assert main(argv) == 2  # the CheckpointError raised on the loader thread, re-raised
    assert "config.json" in capsys.readouterr().err


def test_context_health_log_and_a_stop_with_requests_in_flight(target_dir: Path) -> None:
    """One real server process: max_tokens beyond the context is a 400 with the numbers; health
    polls leave no access-log lines; Ctrl-C with requests in flight gives each client an OpenAI
    error object and prints no traceback."""
    import json
    import threading

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "spectool.cli.app", "serve", str(target_dir), "--port", str(port)]
    argv += ["--device", "cpu", "--max-seq-len", "4096", "--served-model-name", "tiny"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    long = {"model": "tiny", "prompt": "hello", "max_tokens": 4000, "ignore_eos": True}
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
        for path, body in [
            ("/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 5000}),
            (
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000},
            ),
        ]:
            response = httpx.post(f"{url}{path}", json=body, timeout=30.0)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert "maximum context length is 4096 tokens" in error["message"]
            assert "5000 in the completion" in error["message"] and error["param"] == "max_tokens"
        ok = httpx.post(f"{url}/v1/completions", json={**long, "max_tokens": 2}, timeout=30.0)
        assert ok.status_code == 200

        plain: list[httpx.Response] = []
        waiter = threading.Thread(
            target=lambda: plain.append(httpx.post(f"{url}/v1/completions", json=long, timeout=60))
        )
        waiter.start()
        with httpx.stream(
            "POST", f"{url}/v1/completions", json={**long, "stream": True}, timeout=60
        ) as streamed:
            lines = streamed.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert "choices" in first
            process.send_signal(signal.SIGINT)
            events = [line[6:] for line in lines if line.startswith("data: ")]
        waiter.join(60)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert (
        events[-1] == "[DONE]"
        and "server shutting down" in json.loads(events[-2])["error"]["message"]
    )
    assert plain[0].status_code == 503
    assert plain[0].json()["error"]["message"].endswith("server shutting down")
    assert process.returncode == 130 and "Traceback" not in err and "CancelledError" not in err
    assert "POST /v1/completions" in out and "/health" not in out  # polled many times above
