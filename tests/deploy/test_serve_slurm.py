"""Issue 25: ``spectool serve BUILD --launcher slurm`` against a real single-node Slurm cluster
(``slurm_cluster.Cluster``), with the ``trtllm-serve`` double standing in for TensorRT-LLM and a
``trtllm-llmapi-launch`` double that does what TensorRT-LLM's does with ranks (rank 0 runs the
command, the others an MPI worker: here a sleep).

A TP 2 build runs as a batch job of 2 tasks (``srun --mpi=pmix``, the script build writes);
serve reaches readiness on the head rank, the server answers a completion, and Ctrl-C leaves no
job in ``squeue`` and no process of the job within 10 s.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from deploy_helpers import EAGLE3, LLAMA
from slurm_cluster import Cluster

from spectool.cli.app import main

DOUBLE = Path(__file__).resolve().parents[1] / "trtllm_double" / "trtllm_serve_double.py"
LAUNCH_DOUBLE = """#!/bin/sh
# Stand-in for TensorRT-LLM's trtllm-llmapi-launch (tensorrt_llm/llmapi/trtllm-llmapi-launch):
# rank 0 runs the command; every other rank runs an MPI worker (here: waits). The rank: Open
# MPI's OMPI_COMM_WORLD_RANK under mpirun, SLURM_PROCID under srun.
if [ "${OMPI_COMM_WORLD_RANK:-${SLURM_PROCID:-0}}" = "0" ]; then exec "$@"; fi
exec sleep 100000
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def doubles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with ``trtllm-serve`` and ``trtllm-llmapi-launch`` doubles."""
    folder = tmp_path_factory.mktemp("bin")
    serve = folder / "trtllm-serve"
    serve.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DOUBLE}" "$@"\n', encoding="utf-8")
    (folder / "trtllm-llmapi-launch").write_text(LAUNCH_DOUBLE, encoding="utf-8")
    for exe in folder.iterdir():
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job_processes(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


def _tp2_build(make_ckpt, tmp_path: Path, capsys) -> Path:  # noqa: ANN001
    """A TP 2 TensorRT-LLM build folder (Llama-3.1-8B with its EAGLE-3 head)."""
    out = tmp_path / "build"
    argv = ["build", str(make_ckpt(LLAMA)), str(make_ckpt(EAGLE3)), "--gpu", "h100-sxm"]
    assert main([*argv, "--tp", "2", "--trtllm-version", "1.2.1", "--out", str(out)]) == 0
    capsys.readouterr()
    return out


def _serve(out: Path, launcher: str, base_env: dict, doubles: Path, port: int):  # noqa: ANN202
    """``spectool serve OUT --launcher L`` with the doubles first on PATH, output merged."""
    env = {
        **base_env,
        "PATH": f"{doubles}:{os.environ['PATH']}",
        "TRTLLM_DOUBLE_RELEASE": "1.2",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("HOSTFILE", None)
    cmd = [sys.executable, "-m", "spectool.cli.app", "serve", str(out), "--launcher", launcher]
    return subprocess.Popen(  # noqa: S603
        [*cmd, "--port", str(port), "--ready-timeout", "60"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # "ready after" goes to stdout, the rest to stderr
        text=True,
    )


def _until_ready(proc: subprocess.Popen) -> str:
    """Its output up to the "ready after" line (or its end, or 90 s)."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "ready after" in line:
            break
    return "".join(lines)


def _answers_on_rank_0_and_ctrl_c_stops_it(proc: subprocess.Popen, port: int) -> None:
    """A completion answered by rank 0 (rank 1 waits), then Ctrl-C: exit 130."""
    answer = httpx.post(
        f"http://127.0.0.1:{port}/v1/completions",
        json={"model": "m", "prompt": "hello", "max_tokens": 4},
        timeout=10,
    )
    assert answer.status_code == 200
    assert len(_job_processes(str(DOUBLE))) == 1  # the server: rank 0 only
    assert len(_job_processes("sleep 100000")) == 1  # rank 1's stand-in worker
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130


def _no_rank_left(within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and (
        _job_processes(str(DOUBLE)) or _job_processes("sleep 100000")
    ):
        time.sleep(0.2)
    assert _job_processes(str(DOUBLE)) == [] and _job_processes("sleep 100000") == []


def test_serve_launcher_slurm_ready_answers_and_ctrl_c_leaves_nothing(
    cluster: Cluster, doubles: Path, make_ckpt, tmp_path: Path, capsys
) -> None:
    out = _tp2_build(make_ckpt, tmp_path, capsys)
    port = _free_port()
    proc = _serve(out, "slurm", cluster.env, doubles, port)
    try:
        text = _until_ready(proc)
        assert "ready after" in text, text
        assert "submitted Slurm job" in text, text
        jobs = cluster.jobs()
        assert len(jobs) == 1, jobs
        _answers_on_rank_0_and_ctrl_c_stops_it(proc, port)
        rest = proc.stdout.read()
        assert "squeue no longer lists it" in rest, rest
        assert cluster.jobs() == []
        _no_rank_left()
        assert (out / f"spectool-serve-{jobs[0]}.out").is_file()  # the job's output, kept
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _mpirun() -> None:
    """Open MPI's mpirun, apt-installed when missing (root, as in CI); a clear error else."""
    if shutil.which("mpirun"):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(
            "the mpirun launcher test needs Open MPI: apt-get install -y openmpi-bin"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "openmpi-bin"], check=True, env=env)


def test_serve_launcher_mpirun_ready_answers_and_ctrl_c_leaves_nothing(
    doubles: Path, make_ckpt, tmp_path: Path, capsys
) -> None:
    """A TP 2 build under real Open MPI mpirun (2 ranks on this host): ready, a completion,
    Ctrl-C stops both ranks."""
    _mpirun()
    out = _tp2_build(make_ckpt, tmp_path, capsys)
    port = _free_port()
    proc = _serve(out, "mpirun", dict(os.environ), doubles, port)
    try:
        text = _until_ready(proc)
        assert "ready after" in text, text
        assert "starting mpirun -np 2" in text, text
        _answers_on_rank_0_and_ctrl_c_stops_it(proc, port)
        _no_rank_left()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_local_multi_node_build_names_the_slurm_launcher(
    make_ckpt, tmp_path, capsys, monkeypatch
) -> None:
    out = tmp_path / "build"
    argv = ["build", str(make_ckpt(LLAMA)), str(make_ckpt(EAGLE3)), "--gpu", "h100-sxm"]
    layout = ["--tp", "8", "--pp", "2", "--nodes", "2", "--gpus-per-node", "8"]
    assert main([*argv, *layout, "--trtllm-version", "1.2.1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["serve", str(out)]) == 1  # one trtllm-serve here cannot start other nodes
    err = capsys.readouterr().err
    assert "--launcher slurm" in err and "launch.slurm" in err and err.count("\n") == 1
    monkeypatch.delenv("HOSTFILE", raising=False)
    assert main(["serve", str(out), "--launcher", "mpirun"]) == 2  # which hosts? HOSTFILE says
    assert "set HOSTFILE to an Open MPI hostfile with 2 hosts" in capsys.readouterr().err


def test_the_launcher_applies_to_tensorrt_llm_builds(
    tiny_pair: tuple[Path, Path], tmp_path: Path, capsys
) -> None:
    out = tmp_path / "torch-build"
    target, drafter = map(str, tiny_pair)
    assert main(["build", target, drafter, "--engine", "torch", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["serve", str(out), "--launcher", "slurm"]) == 2
    assert "--launcher: slurm launches TensorRT-LLM builds" in capsys.readouterr().err
    assert main(["serve", str(out), "--launcher", "k8s"]) == 2
    assert main(["serve", target, "--launcher", "slurm"]) == 2  # not a build folder
