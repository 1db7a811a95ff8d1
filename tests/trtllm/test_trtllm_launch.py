"""trtllm-serve / trtllm-build argv per release, executable lookup, and the /health readiness wait
every server child goes through (against a real local HTTP server)."""

from __future__ import annotations

import http.server
import os
import stat
import threading
import time
from contextlib import contextmanager

import pytest

from spectool.deploy.supervise import poll_health
from spectool.errors import ConfigError, EngineMissingError
from spectool.trtllm.launch import (
    build_mode_for_method,
    build_serve_argv,
    build_trtllm_build_argv,
    find_trtllm_build,
    find_trtllm_serve,
)


@pytest.mark.parametrize(
    ("release", "backend", "backend_flag", "config_flag"),
    [
        ("0.21", "pytorch", "pytorch", "--extra_llm_api_options"),
        ("0.21", "tensorrt", None, "--extra_llm_api_options"),
        ("1.0", "pytorch", "pytorch", "--extra_llm_api_options"),
        ("1.1", "tensorrt", "tensorrt", "--extra_llm_api_options"),
        ("1.2", "pytorch", "pytorch", "--config"),
        ("1.2", "tensorrt", "tensorrt", "--config"),
        ("main", "pytorch", None, "--config"),
    ],
)
def test_serve_argv_per_release(release, backend, backend_flag, config_flag):
    argv = build_serve_argv(
        "meta-llama/Llama-3.1-8B-Instruct",
        release=release,
        backend=backend,
        config_path="out/speculative.yaml",
        port=8123,
    )
    assert argv[:2] == ["trtllm-serve", "meta-llama/Llama-3.1-8B-Instruct"]
    flags = [a for a in argv if a.startswith("--")]
    expected = ["--host", "--port", config_flag]
    if backend_flag:
        expected.insert(0, "--backend")
        assert argv[argv.index("--backend") + 1] == backend_flag
    assert flags == expected
    assert argv[argv.index(config_flag) + 1] == "out/speculative.yaml"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "8123"
    assert all(isinstance(a, str) for a in argv)


def test_serve_argv_optional_flags_for_an_engine():
    argv = build_serve_argv(
        "/engines/llama-8b-eagle",
        release="1.1",
        backend="tensorrt",
        config_path=None,
        tokenizer="/ckpt/llama-8b",
        tp_size=2,
        max_batch_size=16,
        max_num_tokens=4096,
        max_seq_len=8192,
        kv_cache_free_gpu_memory_fraction=0.8,
    )
    assert argv[4:] == [
        "--host", "127.0.0.1", "--port", "8000",
        "--tokenizer", "/ckpt/llama-8b",
        "--tp_size", "2",
        "--max_batch_size", "16",
        "--max_num_tokens", "4096",
        "--max_seq_len", "8192",
        "--kv_cache_free_gpu_memory_fraction", "0.8",
    ]  # fmt: skip


def test_serve_argv_refusals():
    with pytest.raises(ConfigError, match="removed"):
        build_serve_argv("m", release="main", backend="tensorrt", config_path=None)
    with pytest.raises(ConfigError, match="loopback"):
        build_serve_argv("m", release="1.2", backend="pytorch", config_path=None, host="0.0.0.0")
    with pytest.raises(ConfigError, match="port"):
        build_serve_argv("m", release="1.2", backend="pytorch", config_path=None, port=70000)
    with pytest.raises(ConfigError, match="tp_size"):
        build_serve_argv("m", release="1.2", backend="pytorch", config_path=None, tp_size=0)


def test_trtllm_build_argv():
    argv = build_trtllm_build_argv(
        release="1.2",
        checkpoint_dir="/ckpt/target",
        output_dir="/engines/target",
        speculative_decoding_mode=build_mode_for_method("draft_model"),
        max_draft_len=4,
        max_batch_size=8,
        max_seq_len=4096,
        gather_generation_logits=True,
    )
    assert argv == [
        "trtllm-build",
        "--checkpoint_dir", "/ckpt/target",
        "--output_dir", "/engines/target",
        "--speculative_decoding_mode", "draft_tokens_external",
        "--max_draft_len", "4",
        "--max_batch_size", "8",
        "--max_seq_len", "4096",
        "--use_paged_context_fmha", "enable",
        "--gather_generation_logits",
    ]  # fmt: skip
    plain = build_trtllm_build_argv(
        release="0.21",
        checkpoint_dir="c",
        output_dir="o",
        speculative_decoding_mode=None,
        use_paged_context_fmha=False,
    )
    assert plain == ["trtllm-build", "--checkpoint_dir", "c", "--output_dir", "o"]


def test_trtllm_build_refusals():
    with pytest.raises(ConfigError, match="removed"):
        build_trtllm_build_argv(
            release="main", checkpoint_dir="c", output_dir="o", speculative_decoding_mode=None
        )
    with pytest.raises(ConfigError, match="not one of"):
        build_trtllm_build_argv(
            release="1.2",
            checkpoint_dir="c",
            output_dir="o",
            speculative_decoding_mode="eagle3",
            max_draft_len=4,
        )
    with pytest.raises(ConfigError, match="required"):
        build_trtllm_build_argv(
            release="1.2", checkpoint_dir="c", output_dir="o", speculative_decoding_mode="medusa"
        )
    with pytest.raises(ConfigError, match="draft tree"):
        build_trtllm_build_argv(
            release="1.2",
            checkpoint_dir="c",
            output_dir="o",
            speculative_decoding_mode="eagle",
            max_draft_len=4,
        )
    eagle = build_trtllm_build_argv(
        release="1.2", checkpoint_dir="c", output_dir="o", speculative_decoding_mode="eagle"
    )
    assert (
        "--max_draft_len" not in eagle
        and eagle[eagle.index("--speculative_decoding_mode") + 1] == "eagle"
    )
    with pytest.raises(ConfigError, match="engine mode"):
        build_mode_for_method("eagle3")
    assert build_mode_for_method("eagle") == "eagle"


def test_find_executables(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EngineMissingError, match="trtllm-serve not found on PATH; install"):
        find_trtllm_serve()
    with pytest.raises(EngineMissingError, match="trtllm-build"):
        find_trtllm_build()
    exe = tmp_path / "trtllm-serve"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    assert find_trtllm_serve() == os.fspath(exe)


class _Health(http.server.BaseHTTPRequestHandler):
    not_ready_answers = 0  # set per server
    calls = 0

    def do_GET(self):  # noqa: N802 (http.server API)
        type(self).calls += 1
        ready = self.path == "/health" and type(self).calls > type(self).not_ready_answers
        self.send_response(200 if ready else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


@contextmanager
def _server(not_ready_answers):
    handler = type("H", (_Health,), {"not_ready_answers": not_ready_answers, "calls": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_poll_health_polls_until_200():
    with _server(not_ready_answers=2) as (url, handler):
        wait = poll_health(url + "/health", timeout_s=10, interval_s=0.05)
        assert (wait.outcome, wait.last) == ("ready", "HTTP 503")
        assert handler.calls == 3
        assert 0.09 <= wait.waited_s < 10


def test_poll_health_times_out():
    with _server(not_ready_answers=10**9) as (url, _):
        start = time.perf_counter()
        wait = poll_health(url + "/health", timeout_s=0.3, interval_s=0.05)
        assert (wait.outcome, wait.last) == ("timeout", "HTTP 503")
        assert 0.3 <= wait.waited_s < 3
        assert time.perf_counter() - start < 3


def test_poll_health_without_a_server_a_dead_child_or_a_stop():
    with _server(0) as (url, _):
        pass  # closed: the port now refuses connections
    wait = poll_health(url, timeout_s=0.3, interval_s=0.05)
    assert (wait.outcome, wait.last) == ("timeout", "ConnectError")
    wait = poll_health(url, timeout_s=5, exit_code=lambda: 7)
    assert (wait.outcome, wait.exit_code) == ("exited", 7)
    wait = poll_health(url, timeout_s=5, stopped=lambda: True)
    assert wait.outcome == "stopped"


def test_ipv6_loopback_is_refused_for_trtllm_serve():
    from spectool.errors import ConfigError
    from spectool.trtllm.launch import build_serve_argv

    with pytest.raises(ConfigError, match="IPv4 socket only"):
        build_serve_argv("m", release="1.2", backend="pytorch", config_path=None, host="::1")
