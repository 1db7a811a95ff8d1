"""``spectool serve BUILD --launcher mpirun``: the build's ``trtllm-serve`` under ``mpirun``.

The command is ``launch-mpirun.sh``'s (:func:`spectool.deploy.launch_files.mpirun_argv`):
``mpirun -np WORLD [--hostfile $HOSTFILE --map-by ppr:G:node] trtllm-llmapi-launch
trtllm-serve ...``, one rank per GPU of the build's layout; ``trtllm-llmapi-launch`` serves on
rank 0 (the first host) and runs an MPI worker on every other rank. Without ``HOSTFILE`` Open MPI
runs every rank on this host; a multi-node build needs it. spectool supervises ``mpirun`` like
any server child (:func:`spectool.deploy.supervise.run_supervised`): ``/health`` on the host and
port asked for, Ctrl-C and SIGTERM forwarded to its process group (Open MPI passes them to
every rank and stops them), the group empty when serve returns.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from spectool.deploy.launch_files import mpirun_argv
from spectool.deploy.slurm import build_layout
from spectool.errors import BadInputError

if TYPE_CHECKING:
    from spectool.deploy.launch import ServePlan
    from spectool.deploy.supervise import ChildSpec


def mpirun_child(plan: ServePlan, spec: ChildSpec) -> ChildSpec:
    """``spec`` (the build's ``trtllm-serve`` child) run under ``mpirun`` on the build's layout.

    :class:`BadInputError` (exit 2) for a multi-node build without ``HOSTFILE``."""
    layout = build_layout(plan)
    hostfile = os.environ.get("HOSTFILE") or None
    if layout.nodes > 1 and hostfile is None:
        raise BadInputError(
            "--launcher mpirun",
            f"the build spans {layout.nodes} nodes: set HOSTFILE to an Open MPI hostfile with "
            f"{layout.nodes} hosts, {layout.gpus_per_node} slots each",
        )
    argv = mpirun_argv(spec.argv, layout, hostfile=hostfile, as_root=os.geteuid() == 0)
    return dataclasses.replace(spec, argv=tuple(argv), name="mpirun trtllm-serve")
