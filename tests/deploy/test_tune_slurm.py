"""Issue 25 item 3: ``tune --gpus 2 --launcher slurm`` against a real single-node Slurm cluster
(``slurm_cluster.Cluster`` with two stand-in GPUs), the ``trtllm-serve`` double as payload.

The double's engine is deterministic (``tests/trtllm_double/double_engine.py``: speculation pays
at concurrency 1, loses at 4), so the concurrent run (baseline and k=1 servers up at once, one
Slurm job each, pairs measured together) must reach the decision of the sequential run
(``--gpus 1``: one server at a time, the baseline bracketing the speculative cells), and leave no
job in ``squeue`` and no server process.
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from deploy_helpers import LLAMA
from slurm_cluster import Cluster

from spectool.cli.app import main

DOUBLE = Path(__file__).resolve().parents[1] / "trtllm_double" / "trtllm_serve_double.py"
DRAFT = "meta-llama/Llama-3.2-1B-Instruct"
EVENT = re.compile(r"double: (started|ready|stopped) t=([\d.]+) (.*)")


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(tmp_path_factory.mktemp("slurm-gpus"), gpus=2)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def double_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    exe = folder / "trtllm-serve"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DOUBLE}" "$@"\n', encoding="utf-8")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}:/usr/local/bin:/usr/bin:/bin")
    monkeypatch.setenv("TRTLLM_DOUBLE_RELEASE", "1.2")
    monkeypatch.setenv("TRTLLM_DOUBLE_LOAD_S", "0.5")  # loading: what side by side saves
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return exe


def _tune_argv(target: Path, drafter: Path, out: Path, *extra: str) -> list[str]:
    # 8 prompts of 8 output tokens each: every pair of a cell sends alike, so it settles at once
    workload = out.parent / "workload.jsonl"
    lines = (json.dumps({"prompt": f"Question {i}: why?", "max_tokens": 8}) for i in range(8))
    workload.write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["tune", str(target), str(drafter), "--method", "draft_model", "--engine", "trtllm"]
    argv += ["--max-draft-len", "1", "--trtllm-version", "1.2.1", "--gpu", "h100-sxm"]
    argv += ["--concurrency", "1,4", "--workload", str(workload), "--num-prompts", "8"]
    return [*argv, "--objective", "steps", "--budget", "1", "--out", str(out), *extra]


def _lifetimes(log: Path) -> list[dict[str, str | float]]:
    """The double's servers in one log: start and stop times, and where they ran."""
    servers: list[dict[str, str | float]] = []
    for line in log.read_text(encoding="utf-8").splitlines():
        m = EVENT.match(line)
        if m is None:
            continue
        event, t, rest = (
            m.group(1),
            float(m.group(2)),
            dict(f.split("=", 1) for f in m.group(3).split()),
        )
        if event == "started":
            servers.append({"started": t, **rest})
        else:
            servers[-1][event] = t
    return servers


def _double_processes() -> list[str]:
    out = subprocess.run(["pgrep", "-af", str(DOUBLE)], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


def test_tune_gpus_2_launcher_slurm_runs_two_servers_at_once_and_decides_as_sequential(
    gpu_cluster: Cluster, double_on_path: Path, make_ckpt, tmp_path: Path, monkeypatch, capsys
) -> None:
    target, drafter = make_ckpt(LLAMA), make_ckpt(DRAFT)
    seq, par = tmp_path / "sequential", tmp_path / "concurrent"
    # the sequential run in a process of its own, at the same time (the test's wall time; the
    # double reports its modelled step times, so sharing the CPUs cannot move the decision)
    sequential = subprocess.Popen(  # noqa: S603
        [
            sys.executable,
            "-m",
            "spectool.cli.app",
            *_tune_argv(target, drafter, seq, "--gpus", "1"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        monkeypatch.setenv("SLURM_CONF", gpu_cluster.env["SLURM_CONF"])
        concurrent = _tune_argv(target, drafter, par, "--gpus", "2", "--launcher", "slurm")
        assert main(concurrent) == 0
        shown = capsys.readouterr().out
        assert "Servers: concurrent design" in shown and "s saved." in shown, shown
        output, _ = sequential.communicate(timeout=120)
        assert sequential.returncode == 0, output
        assert "Servers: bracketed design" in output and "s saved." not in output, output
    finally:
        if sequential.poll() is None:
            sequential.kill()
            sequential.wait()
    capsys.readouterr()

    one, two = (json.loads((d / "decision.json").read_text()) for d in (seq, par))
    assert one["schedule"] == two["schedule"] == {"1": 1, "4": 0}
    assert one["measurement"]["design"] == "bracketed" and one["measurement"]["saved_s"] == 0
    assert {c["design"] for c in one["cells"]} == {"bracketed"}
    m = two["measurement"]
    assert m["design"] == "concurrent" and m["launcher"] == "slurm" and m["sets"] == 2
    assert {c["design"] for c in two["cells"]} == {"concurrent"}
    # sequential restarts: k=0, k=1, k=0 again (the bracket); here k=0 and k=1 loaded together
    assert m["server_starts"] == 2 and m["sequential_starts"] == 3
    assert m["saved_s"] > 0.5 and m["waited_for_servers_s"] < m["sequential_start_s"]
    assert "**concurrent** design" in (par / "report.md").read_text()

    # two configurations at once: each server's log says when it was ready (the double's own
    # clock) and the run's record when it was stopped; the baseline's and k=1's overlap, each
    # in its own Slurm job with its own GPU
    (base,) = _lifetimes(par / "logs" / "trtllm-k0.log")
    (spec,) = _lifetimes(par / "logs" / "trtllm-k1.log")
    stopped = {s["k"]: s["stopped_at"] for s in m["servers"]}
    assert spec["ready"] < stopped[0] and base["ready"] < stopped[1]
    assert base["SLURM_JOB_ID"] != spec["SLURM_JOB_ID"] != "-"
    assert {base["CUDA_VISIBLE_DEVICES"], spec["CUDA_VISIBLE_DEVICES"]} == {"0", "1"}
    # the sequential run's servers ran one after another, each stopped (SIGTERM: its log says)
    # before the next one started
    seq_servers = sorted(
        (s for k in (0, 1) for s in _lifetimes(seq / "logs" / f"trtllm-k{k}.log")),
        key=lambda s: s["started"],
    )
    assert len(seq_servers) == 3
    assert all(
        a["stopped"] <= b["started"] for a, b in zip(seq_servers, seq_servers[1:], strict=False)
    )

    assert gpu_cluster.jobs() == []
    assert _double_processes() == []
