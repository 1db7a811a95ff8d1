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
