"""Hub references resolve through the real huggingface_hub cache, offline, without weights."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ckpt_factory import fixture_tensors

SHA = "0123456789abcdef0123456789abcdef01234567"


def _snapshot(hf_home: Path, repo: str, src: Path, files: list[str]) -> Path:
    repo_dir = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    snap = repo_dir / "snapshots" / SHA
    snap.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(SHA)
    for name in files:
        if (src / name).exists():
            shutil.copy(src / name, snap / name)
    return snap


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
        timeout=120,
    )


def test_offline_cached_repo_with_local_headers(make_ckpt, tmp_path: Path) -> None:
    src = make_ckpt("Qwen/Qwen3-0.6B")
    _snapshot(
        tmp_path, "Qwen/Qwen3-0.6B", src, ["config.json", "tokenizer.json", "model.safetensors"]
    )
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "SPECTOOL_CACHE": str(tmp_path / "sc")}
    out = _run(
        "from spectool.ckpt.refs import resolve_checkpoint as r; c = r('Qwen/Qwen3-0.6B');"
        "print(c.kind, c.revision, c.tokenizer.size, len(c.tensors))",
        env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["causal_lm", SHA, "151669", "310"]


def test_offline_tensor_table_from_spectool_cache(tmp_path: Path) -> None:
    from ckpt_factory import fixture_dir

    repo = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    _snapshot(tmp_path, repo, fixture_dir(repo), ["config.json"])
    tensors, _ = fixture_tensors(repo)
    cache = tmp_path / "sc" / "tensors"
    cache.mkdir(parents=True)
    table = {n: [d, s, "pytorch_model.bin"] for n, (d, s) in tensors.items()}
    (cache / f"{repo.replace('/', '--')}--{SHA}.json").write_text(json.dumps(table))
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "SPECTOOL_CACHE": str(tmp_path / "sc")}
    out = _run(
        f"from spectool.ckpt.refs import resolve_checkpoint as r; print(r('{repo}').kind)", env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "eagle3"


def test_offline_and_not_cached_is_one_clear_line(tmp_path: Path) -> None:
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "spectool.cli.app", "check", "nobody/nothing", "--engine", "none"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
        timeout=120,
    )
    assert out.returncode == 2
    assert (
        out.stderr.count("\n") == 1 and "nobody/nothing" in out.stderr and "offline" in out.stderr
    )
    assert "Traceback" not in out.stderr


class SilentHub:
    """A TCP endpoint that accepts connections, counts them and never answers: a Hub that
    cannot be reached in time (what a dead network or a black-holing proxy looks like)."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections: list = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                self.connections.append(self.sock.accept()[0])
            except OSError:
                continue

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for conn in self.connections:
            conn.close()
        self.sock.close()


def _check(ref: str, env: dict[str, str], cwd: Path, *extra: str):
    import time

    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "spectool.cli.app", "check", ref, "--engine", "none", *extra],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "", **env},
        cwd=cwd,
        check=False,
        timeout=120,
    )
    return out, time.monotonic() - start


def test_unreachable_hub_fails_fast_once_in_one_line(tmp_path: Path) -> None:
    hub = SilentHub()
    try:
        env = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": hub.url, "SPECTOOL_HUB_TIMEOUT": "1"}
        out, seconds = _check("nobody/nothing", env, tmp_path)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert "no folder nobody/nothing" in out.stderr
        assert "unreachable to look up repo nobody/nothing" in out.stderr
        assert len(hub.connections) == 1  # one attempt, no retries
        assert seconds < 10  # huggingface_hub alone retried for about 25 s
        # --json: the same failure as one JSON object on stdout.
        out, _ = _check("nobody/nothing", env, tmp_path, "--json")
        error = json.loads(out.stdout)["error"]
        assert error["where"] == "nobody/nothing" and error["exit_code"] == 2
        assert "unreachable" in error["message"] and out.returncode == 2
    finally:
        hub.close()


def test_path_like_references_never_reach_the_hub(tmp_path: Path) -> None:
    hub = SilentHub()
    (tmp_path / "nope").mkdir()
    try:
        env = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": hub.url, "HOME": str(tmp_path)}
        for ref, needle in [
            ("nope/model", "nope exists; is the name mistyped?"),
            ("./x", "no such folder"),
            (str(tmp_path / "abs" / "x"), "no such folder"),
            ("~/x", "no such folder"),
        ]:
            out, _ = _check(ref, env, tmp_path)
            assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
            assert needle in out.stderr and ref in out.stderr
        assert hub.connections == []
    finally:
        hub.close()


def test_json_error_object_on_usage_errors(tmp_path: Path) -> None:
    out, _ = _check("demo", {}, tmp_path, "--json", "--tp", "many")
    assert out.returncode == 2
    assert "--tp" in json.loads(out.stdout)["error"]["message"]
