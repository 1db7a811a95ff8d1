"""Launch files of a multi-GPU TensorRT-LLM build: a Slurm batch script and an ``mpirun`` script.

One MPI rank per GPU (world size = TP x PP), each running ``trtllm-llmapi-launch trtllm-serve``:

* ``launch.slurm`` follows TensorRT-LLM's ``examples/llm-api/llm_mgmn_trtllm_serve.sh`` (@
  0bd88711aa8f): ``#SBATCH -N`` nodes, ``--ntasks-per-node`` GPUs per node, then
  ``srun --mpi=pmix ... trtllm-llmapi-launch trtllm-serve MODEL ...`` ("the number of MPI
  processes should be the same as the model world size"); ``docs/source/commands/trtllm-serve/
  trtllm-serve.rst`` (@ 5c0c175b854e) shows the same ``srun --mpi=pmix`` form. Account,
  partition, time and container options (``--container-image``/``--container-mounts``, which the
  example passes to srun) are site-specific: left to the user as comments. The example notes that
  downloading from the Hugging Face hub is not supported in Slurm mode: the model must be a
  local folder every node sees.
* ``launch-mpirun.sh`` is the bare-host form of the same launch: ``mpirun -np WORLD`` over a
  hostfile the user provides (``HOSTFILE``), ``trtllm-llmapi-launch`` in front of the same
  ``trtllm-serve`` command. TensorRT-LLM's own docs show only the srun form; this file is the
  usual Open MPI spelling of it, not a documented TensorRT-LLM example.

* ``lws.yaml`` (several nodes only): a Kubernetes LeaderWorkerSet for the same launch
  (:mod:`spectool.deploy.lws`).

All run the exact ``trtllm-serve`` argv ``build`` records in the manifest (shell-quoted; the
LeaderWorkerSet binds the pod's address). ``spectool serve --launcher slurm`` submits the first
(:mod:`spectool.deploy.slurm`).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from spectool.parallel import ParallelLayout

SLURM_NAME = "launch.slurm"
MPIRUN_NAME = "launch-mpirun.sh"


def _command(argv: Sequence[str]) -> str:
    """``argv`` shell-quoted, one flag (with its value) per continued line."""
    lines: list[str] = []
    for arg in argv:
        word = shlex.quote(arg)
        if lines and not arg.startswith("--") and lines[-1].startswith("--"):
            lines[-1] += " " + word
        else:
            lines.append(word)
    return " \\\n    ".join(lines)


def slurm_script(argv: Sequence[str], layout: ParallelLayout, *, title: str) -> str:
    """``sbatch`` script running ``argv`` (a ``trtllm-serve`` command) on ``layout``'s nodes."""
    return f"""#!/bin/bash
# spectool: {title}
# TP {layout.tp} x PP {layout.pp} = {layout.world_size} ranks (EP {layout.ep}{", attention DP" if layout.attention_dp else ""}): {layout.nodes} node(s) x {layout.gpus_per_node} GPUs, one MPI task per GPU.
# After TensorRT-LLM examples/llm-api/llm_mgmn_trtllm_serve.sh; submit with: sbatch {SLURM_NAME}
#SBATCH --job-name=spectool-serve
#SBATCH --nodes={layout.nodes}
#SBATCH --ntasks-per-node={layout.gpus_per_node}
#SBATCH --output=spectool-serve-%j.out
# Site-specific, left to you (as in TensorRT-LLM's example):
#   #SBATCH --account=<account>
#   #SBATCH --partition=<partition>
#   #SBATCH --time=01:00:00
#   #SBATCH --gpus-per-node={layout.gpus_per_node}
# Containers (pyxis/enroot): add to the srun line below, e.g.
#   --container-image=<TensorRT-LLM image> --container-mounts=<model dir>:<model dir>
# The model must be a local folder every node sees (no hub downloads in Slurm mode).
# trtllm-serve binds the host it is given on the first rank's node; change --host to reach it
# from elsewhere.
set -euo pipefail

srun --mpi=pmix \\
    trtllm-llmapi-launch \\
    {_command(argv)}
"""


def mpirun_script(argv: Sequence[str], layout: ParallelLayout, *, title: str) -> str:
    """Bare-host script: ``mpirun -np WORLD --hostfile $HOSTFILE trtllm-llmapi-launch ...``."""
    return f"""#!/bin/bash
# spectool: {title}
# TP {layout.tp} x PP {layout.pp} = {layout.world_size} ranks (EP {layout.ep}{", attention DP" if layout.attention_dp else ""}): {layout.nodes} host(s) x {layout.gpus_per_node} GPUs.
# HOSTFILE lists the hosts, {layout.gpus_per_node} slots each (Open MPI: "host1 slots={layout.gpus_per_node}").
# Every host needs TensorRT-LLM, passwordless ssh between hosts and the model at the same path.
set -euo pipefail
: "${{HOSTFILE:?set HOSTFILE to a hostfile with {layout.nodes} host(s), {layout.gpus_per_node} slots each}}"

mpirun -np {layout.world_size} --hostfile "$HOSTFILE" --map-by ppr:{layout.gpus_per_node}:node \\
    trtllm-llmapi-launch \\
    {_command(argv)}
"""


def mpirun_argv(
    argv: Sequence[str], layout: ParallelLayout, *, hostfile: str | None, as_root: bool
) -> list[str]:
    """``spectool serve --launcher mpirun``'s command: ``launch-mpirun.sh``'s ``mpirun`` line
    (``--hostfile`` only when given: without one Open MPI runs every rank on this host), with
    ``--allow-run-as-root`` for root, which Open MPI otherwise refuses."""
    out = ["mpirun", "-np", str(layout.world_size)]
    if as_root:
        out.append("--allow-run-as-root")
    if hostfile is not None:
        out += ["--hostfile", hostfile, "--map-by", f"ppr:{layout.gpus_per_node}:node"]
    return [*out, "trtllm-llmapi-launch", *argv]


def launch_files(argv: Sequence[str], layout: ParallelLayout, *, title: str) -> dict[str, bytes]:
    """{file name: bytes} of the launch files for ``argv`` on ``layout`` (``lws.yaml`` for
    several nodes)."""
    files = {
        SLURM_NAME: slurm_script(argv, layout, title=title).encode("utf-8"),
        MPIRUN_NAME: mpirun_script(argv, layout, title=title).encode("utf-8"),
    }
    if layout.nodes > 1:
        from spectool.deploy.lws import LWS_NAME, lws_manifest

        files[LWS_NAME] = lws_manifest(argv, layout, title=title).encode("utf-8")
    return files
