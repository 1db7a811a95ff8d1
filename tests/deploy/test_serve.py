"""``spectool serve DIR``: the supervised launcher, end to end against spectool's own server.

The child is started exactly as for TensorRT-LLM (own session, log streamed, /health polled,
signals forwarded, group emptied); here it is ``python -m spectool.cli.app serve ... --engine
torch`` on tiny random models, so every path runs on a CPU.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from deploy_helpers import EAGLE3, LLAMA, children_of, group_members, write_decision

from spectool.cli.app import main
from spectool.cli.serve import parse_draft_len_schedule, torch_serve_request
from spectool.deploy.launch import prepare_serve
from spectool.deploy.machine import MachineFacts
from spectool.errors import BadInputError

START_DEADLINE_S = 90.0
NO_GPU = MachineFacts((), None, None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def torch_build(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    target, drafter = tiny_pair
    out = tmp_path_factory.mktemp("torch-build") / "b"
    argv = [
        "build",
        str(target),
        str(drafter),
        "--engine",
        "torch",
        "--max-draft-len",
        "2",
        "--max-batch-size",
        "4",
        "--max-seq-len",
        "128",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    return out


def _spectool(*argv: str, stdout: Path, stderr: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "spectool.cli.app", *argv]
    return subprocess.Popen(cmd, stdout=stdout.open("wb"), stderr=stderr.open("wb"))


def _wait_for(path: Path, needle: str, process: subprocess.Popen[bytes], deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if needle in path.read_text(errors="replace"):
            return
        assert process.poll() is None, f"spectool serve exited early: {path.read_text()}"
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} not seen in {deadline_s} s")


def test_serve_build_ready_answers_then_sigterm_leaves_no_process(
    torch_build: Path, tmp_path: Path
) -> None:
    port = _free_port()
    out, err = tmp_path / "out", tmp_path / "err"
    parent = _spectool(
        "serve",
        str(torch_build),
        "--port",
        str(port),
        "--served-model-name",
        "tiny",
        "--",
        "--log-level",
        "warning",
        stdout=out,
        stderr=err,
    )
    try:
        _wait_for(out, "ready after", parent, START_DEADLINE_S)
        assert f"http://127.0.0.1:{port}/v1" in out.read_text()
        (child,) = children_of(parent.pid)
        assert os.getpgid(child) == child != os.getpgid(parent.pid)  # its own process group
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "tiny"
        response = httpx.post(
            f"{url}/v1/completions",
            timeout=30.0,
            json={"model": "tiny", "prompt": "the draft", "max_tokens": 4, "ignore_eos": True},
        )
        assert response.json()["usage"]["completion_tokens"] == 4
        metrics = httpx.get(f"{url}/metrics").json()
        assert metrics and all("specDecodingStats" in m for m in metrics)  # speculative.json served
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=30) == 0
    finally:
        if parent.poll() is None:  # a failed assertion: do not leave the server behind
            parent.send_signal(signal.SIGTERM)
            try:
                parent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                parent.kill()
                parent.wait()
    assert group_members(child) == []  # the child and anything it started are gone
    log = err.read_text()
    assert "unmeasured" in log and "--log-level warning" in log
    assert f"--engine-config {torch_build.resolve() / 'speculative.json'}" in log
    assert "spectool server stopped" in log


def test_child_failure_exits_3_with_the_log_tail(torch_build: Path, tmp_path: Path) -> None:
    out, err = tmp_path / "out", tmp_path / "err"
    # The extra --port reaches the child, which refuses it (exit 2) before loading anything.
    parent = _spectool(
        "serve",
        str(torch_build),
        "--port",
        str(_free_port()),
        "--",
        "--port",
        "70000",
        stdout=out,
        stderr=err,
    )
    assert parent.wait(timeout=60) == 3
    log = err.read_text()
    assert (
        "spectool server exited with code 2 before" in log
        and "last lines of spectool server's log" in log
    )
    assert (
        "--port: must be in 0..65535, got 70000" in log.split("last lines")[1]
    )  # the child's own words
    assert children_of(parent.pid) == []


def test_busy_port_is_a_clear_error(torch_build: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        assert main(["serve", str(torch_build), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "another server holds the port" in err
    assert err.count("spectool: error:") == 1
    assert "serving" not in err  # the bind error comes before any "serving" line


def test_cost_gate_picks_the_config_and_says_why(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    target, drafter = tiny_pair
    never = write_decision(
        tmp_path / "never.json", {1: 0, 8: 0}, method="draft_model", engine="torch"
    )
    out = tmp_path / "b"
    assert (
        main(
            [
                "build",
                str(target),
                str(drafter),
                "--engine",
                "torch",
                "--max-draft-len",
                "2",
                "--decision",
                str(never),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    plan = prepare_serve(out, facts=NO_GPU, port=9000)
    assert not plan.gate.speculate and "ratio 1.150" in plan.gate.reason
    assert plan.command.config_file == "baseline.json"
    argv = plan.command.argv
    assert argv[argv.index("--engine-config") + 1] == str(out.resolve() / "baseline.json")
    assert str(drafter) not in plan.command.argv
    forced = prepare_serve(out, facts=NO_GPU, speculation="on")
    assert forced.gate.speculate and forced.gate.warn and str(drafter) in forced.command.argv
    # Pays up to 4, not at 16; the build's max_concurrency turns it off above 4 by itself.
    pays = write_decision(
        tmp_path / "pays.json", {1: 2, 4: 2, 16: 0}, method="draft_model", engine="torch"
    )
    assert (
        main(
            [
                "build",
                str(target),
                str(drafter),
                "--engine",
                "torch",
                "--decision",
                str(pays),
                "--out",
                str(out),
                "--force",
            ]
        )
        == 0
    )
    under_load = prepare_serve(out, facts=NO_GPU, expected_concurrency=16)
    assert under_load.gate.speculate and "turns it off above batch size 4" in under_load.gate.reason
    argv = under_load.command.argv
    config = Path(argv[argv.index("--engine-config") + 1])
    assert config.name == "speculative.json"
    assert json.loads(config.read_text())["max_concurrency"] == 4  # read by the child as is
    assert not prepare_serve(out, facts=NO_GPU, speculation="off").gate.speculate


def test_missing_trtllm_serve_is_exit_2_with_install_hint(
    make_ckpt, tmp_path: Path, capsys, monkeypatch
) -> None:
    out = tmp_path / "b"
    assert (
        main(
            [
                "build",
                str(make_ckpt(LLAMA)),
                str(make_ckpt(EAGLE3)),
                "--gpu",
                "h100-sxm",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    monkeypatch.setenv("PATH", str(tmp_path))
    capsys.readouterr()
    assert main(["serve", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        "trtllm-serve not found" in err and "install TensorRT-LLM" in err and err.count("\n") == 1
    )


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--method", "ngram"], "--method: is fixed by the build"),
        (["extra"], "DRAFTER"),
        (["--engine", "trtllm"], "built for engine torch"),
        (["--speculation", "sometimes"], "--speculation"),
    ],
)
def test_build_folder_option_misuse_is_exit_2(
    torch_build: Path, capsys, argv: list[str], needle: str
) -> None:
    assert main(["serve", str(torch_build), *argv]) == 2
    assert needle in capsys.readouterr().err


def test_build_folder_options_need_a_build_folder(tiny_pair: tuple[Path, Path], capsys) -> None:
    assert main(["serve", str(tiny_pair[0]), "--speculation", "on"]) == 2
    assert main(["serve", str(tiny_pair[0]), "--", "--anything"]) == 2
    assert "build folder" in capsys.readouterr().err


def test_torch_engine_runtime_gate_flags(tiny_pair: tuple[Path, Path]) -> None:
    assert parse_draft_len_schedule("4:4, 8:2") == {4: 4, 8: 2}
    assert parse_draft_len_schedule(None) is None
    with pytest.raises(BadInputError, match="batch:k pairs"):
        parse_draft_len_schedule("4=4")
    target, drafter = map(str, tiny_pair)
    request = torch_serve_request(target, drafter, draft_len_schedule="4:4,8:2", max_draft_len=4)
    assert (request.draft_len_schedule, request.max_concurrency) == ({4: 4, 8: 2}, None)
    assert torch_serve_request(target, drafter, max_concurrency=8).max_concurrency == 8


def test_engine_config_file_sets_the_engine_and_refuses_flags(
    torch_build: Path, tiny_pair: tuple[Path, Path], capsys
) -> None:
    """``--engine-config`` (what serve DIR hands its child) replaces the engine flags; giving
    both, or a drafter the file's method does not use, is one line and exit 2."""
    target, drafter = tiny_pair
    spec, base = torch_build / "speculative.json", torch_build / "baseline.json"
    argv = ["serve", str(target), str(drafter), "--engine", "torch", "--engine-config", str(spec)]
    assert main([*argv, "--max-draft-len", "3"]) == 2
    assert "--max-draft-len: is set by --engine-config" in capsys.readouterr().err
    assert main(["serve", str(target), str(drafter), "--engine-config", str(base)]) == 2
    assert "'none' uses no drafter" in capsys.readouterr().err
    from spectool.deploy.engine_config import read_engine_config

    request = torch_serve_request(str(target), str(drafter), engine_config=read_engine_config(spec))
    assert (request.method, request.max_draft_len, request.max_batch_size) == (
        "draft_model",
        2,
        4,
    )


def test_auto_method_follows_the_drafters_weights(
    tiny_pair: tuple[Path, Path], make_ckpt, capsys
) -> None:
    """``--method auto`` asks spectool.methods which method the drafter's weights call for: an
    EAGLE-3 head is served as eagle3, an EAGLE-1 head (TensorRT-LLM only) refused in one line."""
    target, drafter = tiny_pair
    assert torch_serve_request(str(target), str(drafter)).method == "draft_model"
    assert torch_serve_request(str(target), str(make_ckpt(EAGLE3))).method == "eagle3"
    head = make_ckpt("yuhuili/EAGLE-LLaMA3-Instruct-8B")
    assert main(["serve", str(target), str(head), "--engine", "torch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(eagle); the torch engine drafts with" in err
