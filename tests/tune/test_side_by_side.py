"""``tune --gpus/--launcher`` (issue 25 item 3): GPU sets, server commands, concurrent pairs and
the wall-time ledger. The run against a real Slurm is ``tests/deploy/test_tune_slurm.py``."""

from __future__ import annotations

import dataclasses
import os
import socket
import stat
from pathlib import Path

import pytest

from spectool.cli.app import main
from spectool.errors import BadInputError
from spectool.measure.runner import TrialConfig, TrialResult
from spectool.tuning.gpu_sets import job_name, plan_gpu_sets, server_command
from spectool.tuning.side_by_side import ledger, pair_blocks, sequential_starts

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
DRAFT = "meta-llama/Llama-3.2-1B-Instruct"


def test_gpu_sets_split_the_visible_devices_in_order() -> None:
    sets = plan_gpu_sets(4, "local", engine="trtllm", per_server=2, environ={})
    assert sets.devices == (("0", "1"), ("2", "3")) and sets.concurrent
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    sets = plan_gpu_sets(2, "local", engine="trtllm", per_server=1, environ=env)
    assert sets.devices == (("4",), ("5",))
    argv, child_env = server_command(["trtllm-serve", "m"], sets, 1, environ=env)
    assert argv == ["trtllm-serve", "m"] and child_env["CUDA_VISIBLE_DEVICES"] == "5"
    one = plan_gpu_sets(1, "local", engine="trtllm", per_server=1, environ=env)
    assert not one.concurrent
    assert server_command(["x"], one, 0, environ=env)[1]["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    # --gpus not given: one set of the layout's own GPUs, whatever --tp is (a --tp 2 tune
    # without --gpus is one server at a time, not "1 GPU does not divide into sets of 2")
    default = plan_gpu_sets(None, "local", engine="trtllm", per_server=2, environ={})
    assert default.devices == (("0", "1"),) and not default.concurrent


def test_slurm_servers_are_job_steps_with_their_own_gres(tmp_path: Path, monkeypatch) -> None:
    for name in ("srun", "squeue", "scancel"):
        exe = tmp_path / name
        exe.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    sets = plan_gpu_sets(4, "slurm", engine="trtllm", per_server=2, environ={})
    assert sets.count == 2 and sets.to_json()["sets"] == 2
    env = {"SLURM_JOB_ID": "77", "SLURM_CPUS_ON_NODE": "32", "SLURM_MEM_PER_NODE": "64000"}
    env["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"
    argv, child_env = server_command(["trtllm-serve", "m", "--tp_size", "2"], sets, 1, environ=env)
    cut = argv.index("--")
    assert argv[0] == "srun" and argv[cut + 1 :] == ["trtllm-serve", "m", "--tp_size", "2"]
    flags = set(argv[1:cut])
    assert {"--exact", "--ntasks=1", "--gres=gpu:2", "--cpus-per-task=16", "--mem=32000M"} <= flags
    assert f"--nodelist={socket.gethostname()}" in flags  # the server binds 127.0.0.1
    assert f"--job-name={job_name(1)}" in flags and str(os.getpid()) in job_name(1)
    assert child_env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # Slurm's GRES sets the step's own
    held = {"SLURM_JOB_ID": "77", "SLURM_GPUS_ON_NODE": "2"}
    with pytest.raises(BadInputError, match="4 GPUs asked, the Slurm allocation holds 2"):
        plan_gpu_sets(4, "slurm", engine="trtllm", per_server=2, environ=held)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpus", "3", "--tp", "2"], "--gpus: 3 GPUs do not divide into sets of 2"),
        (["--gpus", "0"], "--gpus: must be >= 1, got 0"),
        (["--launcher", "pbs"], "--launcher: expected one of local, slurm, got 'pbs'"),
        (["--launcher", "slurm"], "--launcher slurm: srun not found on PATH"),
        (["--gpus", "2", "--engine", "torch"], "--gpus: side-by-side servers are for --engine"),
    ],
)
def test_bad_gpus_and_launchers_are_one_line_exit_2(
    argv, message, make_ckpt, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("PATH", "/usr/local/nonexistent")  # no Slurm, no trtllm-serve
    engine = [] if "--engine" in argv else ["--engine", "trtllm"]
    pair = [str(make_ckpt(LLAMA)), str(make_ckpt(DRAFT)), "--method", "draft_model"]
    assert main(["tune", *pair, *engine, *argv, "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "t").exists()  # refused before anything is written


def test_more_gpus_than_cuda_visible_devices_is_refused() -> None:
    with pytest.raises(BadInputError, match="2 GPUs asked, CUDA_VISIBLE_DEVICES lists 1"):
        plan_gpu_sets(
            2, "local", engine="trtllm", per_server=1, environ={"CUDA_VISIBLE_DEVICES": "3"}
        )


def _trial(label: str) -> TrialResult:
    config = TrialConfig(label=label, concurrency=1, num_prompts=2, max_tokens=8)
    return TrialResult(config, (), (), (), (), wall_time_s=0.1, started_at="2026-01-01T00:00:00")


def test_a_concurrent_pair_is_measured_once_for_both_arms_and_resumed_whole() -> None:
    calls: list[tuple[str, str]] = []

    def config(pair: int, arm: int) -> TrialConfig:
        return _trial(f"k={arm} #p{pair}").config

    def both(spec: TrialConfig, base: TrialConfig) -> tuple[TrialResult, TrialResult]:
        calls.append((spec.label, base.label))
        return _trial(spec.label), _trial(base.label)

    saved = {config(1, 3).key(): _trial("k=3 #p1"), config(1, 0).key(): _trial("k=0 #p1")}
    saved[config(2, 3).key()] = _trial("k=3 #p2")  # pair 2 lost its baseline: measured again
    block = pair_blocks(both, config, saved, 3)
    assert block(0, 3).config.label == "k=3 #p0" and block(0, 0).config.label == "k=0 #p0"
    assert block(1, 0).config.label == "k=0 #p1" and block(1, 3).config.label == "k=3 #p1"
    assert block(2, 3).config.label == "k=3 #p2"
    assert calls == [("k=3 #p0", "k=0 #p0"), ("k=3 #p2", "k=0 #p2")]


@dataclasses.dataclass
class _Server:
    k: int
    ready_s: float | None

    def to_json(self) -> dict[str, object]:
        return {"k": self.k, "load_s": self.ready_s}


def test_the_ledger_counts_what_restarting_one_server_per_configuration_costs() -> None:
    # one set: baselines, k=3 at two concurrencies, k=1, then the bracket's baseline
    assert sequential_starts([0, 0, 3, 3, 1], bracket=True) == [0, 3, 1, 0]
    assert sequential_starts([0, 0, 3, 3, 1, 0, 0], bracket=False) == [0, 3, 1, 0]
    servers = [_Server(0, 100.0), _Server(3, 120.0), _Server(1, 110.0)]
    # two sets: the baseline and k=3 loaded together (waited 125 s), k=1 later (110 s)
    got = ledger(servers, [0, 0, 3, 3, 1], 235.0, concurrent=True)
    assert got["sequential_starts"] == 4 and got["sequential_start_s"] == 430.0
    assert got["saved_s"] == 195.0 and got["server_starts"] == 3
    assert got["load_s_total"] == 330.0 and got["waited_for_servers_s"] == 235.0
    same = ledger(servers, [0, 0, 3, 3, 1, 0], 430.0, concurrent=False)
    assert same["saved_s"] == 0.0 and same["sequential_start_s"] == 430.0
