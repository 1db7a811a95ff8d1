"""``tune --gpus N [--launcher local|slurm]``: the GPU sets tune's servers run on, side by side.

A *GPU set* holds the GPUs of one server: the layout's ``--tp`` GPUs on one node. ``--gpus N``
gives ``N / tp`` sets (N must be a multiple of ``tp``: exit 2 otherwise). With one set, tune runs
one server at a time (the bracketed design); with two or more, the baseline server holds set 0
for the whole run and the speculative servers take the others, so baseline and speculative
blocks are measured at the same moment (:mod:`spectool.tuning.side_by_side`).

How a server gets its set:

* ``--launcher local``: ``CUDA_VISIBLE_DEVICES`` names the set's devices. They are taken, in
  order, from the ``CUDA_VISIBLE_DEVICES`` tune itself was given (``N`` must not exceed it), else
  devices ``0..N-1``. On one node a TensorRT-LLM server with ``--tp_size`` starts its own ranks
  from one process (mpi4py's ``MPIPoolExecutor``, no ``mpirun``: NVIDIA/TensorRT-LLM
  ``examples/llm-api/llm_generate_distributed.py``), on the devices that process sees, so each
  server stays on its set. Where ``nvidia-smi`` answers, every set must hold the same GPU
  models (the pairing compares like with like: exit 2 otherwise).
* ``--launcher slurm``: each server is one ``srun`` (no shell):
  ``srun --nodes=1 --ntasks=1 --exact --gres=gpu:<tp> --cpus-per-task=<c> --nodelist=<this
  host> --job-name=<name> --unbuffered -- trtllm-serve ...``. Inside an allocation
  (``SLURM_JOB_ID`` set: tune in an ``sbatch -N1 --gres=gpu:N`` job, on the node) each is a
  job step (``--gpus`` may not exceed the allocation's ``SLURM_GPUS_ON_NODE``), and ``--exact``
  gives a step only the resources it asks for, so steps run at the same time instead of the
  second waiting for the first (srun(1), https://slurm.schedmd.com/srun.html, ``--exact``,
  Slurm >= 21.08). Outside one, srun makes
  one job per server ("If necessary, srun will first create a resource allocation", same page).
  The GRES plugin binds the step's GPUs and sets ``CUDA_VISIBLE_DEVICES`` for it
  (https://slurm.schedmd.com/gres.html, "GPU Management"), so tune sets none. ``--nodelist``
  keeps the servers on tune's own node: they bind 127.0.0.1 and tune's client reaches them
  there. ``<c>`` is this node's CPUs (``SLURM_CPUS_ON_NODE`` inside an allocation) over the
  sets: ``--exact`` would otherwise give a server one CPU. Inside an allocation with a memory
  limit (``SLURM_MEM_PER_NODE``) each step asks for its share of it too, so that no step takes
  the job's whole memory and holds the others back (not exercised by the tests: their cluster
  does not track memory). Stopping a server is SIGTERM to its ``srun``, which ends the step
  ("forcing job termination"); tune then waits until ``squeue`` lists no job or step of that
  name and ``scancel``\\s any that remains (:func:`leftover_ids`, :func:`cancel_leftovers`).
  Checked against a real single-node Slurm 22.05 (``tests/deploy/test_tune_slurm.py``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spectool.deploy.slurm import GONE_TIMEOUT_S
from spectool.errors import BadInputError

LAUNCHERS = ("local", "slurm")
SLURM_COMMANDS = ("srun", "squeue", "scancel")


@dataclass(frozen=True)
class GpuSets:
    """The run's GPU sets: ``devices`` per set (``CUDA_VISIBLE_DEVICES`` locally; empty under
    Slurm, whose GRES plugin picks them), the GPUs of one server, and the launcher."""

    launcher: str
    per_server: int
    devices: tuple[tuple[str, ...], ...]

    @property
    def count(self) -> int:
        return len(self.devices)

    @property
    def concurrent(self) -> bool:
        """Two sets or more: baseline and speculative servers run at the same time."""
        return self.count >= 2

    def label(self, index: int) -> str:
        """How set ``index`` is named in logs and reports."""
        if self.launcher == "slurm":
            return f"slurm step {index} (--gres=gpu:{self.per_server})"
        return f"CUDA_VISIBLE_DEVICES={','.join(self.devices[index])}"

    def to_json(self) -> dict[str, object]:
        return {
            "launcher": self.launcher,
            "gpus": self.count * self.per_server,
            "gpus_per_server": self.per_server,
            "sets": [list(d) for d in self.devices] if self.launcher == "local" else self.count,
        }


def plan_gpu_sets(
    gpus: int | None,
    launcher: str,
    *,
    engine: str,
    per_server: int,
    environ: Mapping[str, str] | None = None,
) -> GpuSets:
    """The sets for ``--gpus``/``--launcher`` (module docstring); :class:`BadInputError` (exit 2)
    for a count that does not divide into sets, a launcher that is missing, or the embedded
    engine (it switches ``k`` in place on one server: its cells are already paired)."""
    env = os.environ if environ is None else environ
    gpus = per_server if gpus is None else gpus  # not given: one set, one server's GPUs
    if launcher not in LAUNCHERS:
        raise BadInputError(
            "--launcher", f"expected one of {', '.join(LAUNCHERS)}, got {launcher!r}"
        )
    if gpus < 1:
        raise BadInputError("--gpus", f"must be >= 1, got {gpus}")
    if engine != "trtllm" and (gpus > 1 or launcher != "local"):
        raise BadInputError(
            "--gpus" if gpus > 1 else "--launcher",
            "side-by-side servers are for --engine trtllm: the embedded engine switches its "
            "draft length in place on one server and pairs its blocks there",
        )
    if gpus % per_server:
        raise BadInputError(
            "--gpus",
            f"{gpus} GPUs do not divide into sets of {per_server} (one server's GPUs, --tp "
            f"{per_server}): give a multiple of {per_server}",
        )
    sets = gpus // per_server
    if launcher == "slurm":
        for command in SLURM_COMMANDS:
            if shutil.which(command) is None:
                raise BadInputError(
                    "--launcher slurm",
                    f"{command} not found on PATH: Slurm's client commands are needed",
                )
        held = env.get("SLURM_GPUS_ON_NODE") if "SLURM_JOB_ID" in env else None
        if held is not None and held.isdigit() and gpus > int(held):
            raise BadInputError(
                "--gpus", f"{gpus} GPUs asked, the Slurm allocation holds {held} on this node"
            )
        return GpuSets("slurm", per_server, tuple(() for _ in range(sets)))
    visible = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if "CUDA_VISIBLE_DEVICES" in env and len(visible) < gpus:
        raise BadInputError(
            "--gpus", f"{gpus} GPUs asked, CUDA_VISIBLE_DEVICES lists {len(visible)}"
        )
    devices = visible[:gpus] if visible else [str(i) for i in range(gpus)]
    found = GpuSets(
        "local",
        per_server,
        tuple(tuple(devices[i * per_server : (i + 1) * per_server]) for i in range(sets)),
    )
    if found.concurrent:
        _same_models(found)
    return found


def _same_models(sets: GpuSets) -> None:
    """Where ``nvidia-smi`` answers: every set holds the same GPU models (exit 2 otherwise)."""
    if shutil.which("nvidia-smi") is None:
        return
    done = subprocess.run(  # noqa: S603
        ["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],  # noqa: S607
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    if done.returncode != 0:
        return
    names = dict(line.split(", ", 1) for line in done.stdout.splitlines() if ", " in line)
    models = [sorted(names.get(d, f"GPU {d}") for d in s) for s in sets.devices]
    if any(m != models[0] for m in models):
        raise BadInputError(
            "--gpus",
            f"the GPU sets hold different GPUs ({'; '.join(', '.join(m) for m in models)}): "
            "concurrent pairs need identical sets",
        )


def job_name(set_index: int) -> str:
    """The Slurm job (or step) name of the server on set ``set_index``: unique to this run."""
    return f"spectool-tune-{os.getpid()}-{set_index}"


def server_command(
    argv: Sequence[str], sets: GpuSets, index: int, environ: Mapping[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run ``argv`` on set ``index`` (module docstring)."""
    env = dict(os.environ if environ is None else environ)
    if sets.launcher == "local":
        if sets.concurrent:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(sets.devices[index])
        return list(argv), env
    inside = "SLURM_JOB_ID" in env
    cpus = int(env.get("SLURM_CPUS_ON_NODE", "0")) if inside else (os.cpu_count() or 1)
    memory = int(env.get("SLURM_MEM_PER_NODE", "0")) if inside else 0  # MB; 0: not limited
    srun = [
        "srun",
        "--nodes=1",
        "--ntasks=1",
        "--exact",
        f"--gres=gpu:{sets.per_server}",
        f"--cpus-per-task={max(1, cpus // sets.count)}",
        *([f"--mem={memory // sets.count}M"] if memory else []),
        f"--nodelist={socket.gethostname()}",
        f"--job-name={job_name(index)}",
        "--unbuffered",
        "--",
    ]
    return [*srun, *argv], env


def leftover_ids(name: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """Jobs (outside an allocation) or steps (inside one) named ``name`` that squeue lists."""
    env = os.environ if environ is None else environ
    job = env.get("SLURM_JOB_ID")
    argv = ["squeue", "-h", "-o", "%i %j"]
    argv += ["-s", "-j", job] if job else ["--name", name]
    done = subprocess.run(  # noqa: S603 (a fixed Slurm command, no shell)
        argv, capture_output=True, text=True, check=False, timeout=60
    )
    rows = [line.split(None, 1) for line in done.stdout.splitlines() if line.strip()]
    return [row[0] for row in rows if len(row) == 2 and row[1].strip() == name]


def cancel_leftovers(name: str, timeout_s: float = GONE_TIMEOUT_S) -> list[str]:
    """Wait for the server's job or step to leave the queue, ``scancel`` it after a grace of a
    third of ``timeout_s``; the ids still listed at the end (empty: nothing left)."""
    deadline = time.monotonic() + timeout_s
    cancelled = False
    while ids := leftover_ids(name):
        if time.monotonic() > deadline:
            return ids
        if not cancelled and time.monotonic() > deadline - 2 * timeout_s / 3:
            subprocess.run(  # noqa: S603
                ["scancel", *ids],  # noqa: S607
                capture_output=True,
                check=False,
                timeout=60,
            )
            cancelled = True
        time.sleep(0.2)
    return []
