"""A real single-node Slurm cluster for tests: munged, slurmctld and slurmd on this machine.

Debian's ``slurm-wlm``, ``munge`` and ``libpmix-dev`` (Slurm's ``--mpi=pmix`` plugin loads
``libpmix.so``, which only the -dev package links) are installed with apt-get when missing (the
tests run as root here and in CI; ``.ci/run`` installs them before the test command). The
daemons read a configuration written into a temporary folder, listen on free ports, and stop with
the session; nothing of a cluster that may already run on the machine is touched except munged,
which is shared (started only when none runs).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge", "libpmix-dev")
BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scancel", "munged")
PMIX_LIBRARY = Path("/usr/lib/x86_64-linux-gnu/libpmix.so")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def install() -> None:
    """apt-get the packages when a binary or the PMIx library is missing; a clear error else."""
    if all(shutil.which(b) for b in BINARIES) and PMIX_LIBRARY.exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(
            f"Slurm tests need {', '.join(PACKAGES)}: apt-get install -y {' '.join(PACKAGES)}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", *PACKAGES], check=True, env=env, capture_output=True
    )


def _fake_gpus(root: Path, gpus: int) -> str:
    """``gpus`` stand-in GPUs for Slurm's GRES plugin: ``gres.conf`` names plain files
    ``dev/nvidia0..`` (the plugin takes the index from the name, so each job step gets
    ``CUDA_VISIBLE_DEVICES`` as on a GPU node; with ``TaskPlugin=task/none`` nothing opens them).
    The node's ``Gres=`` entry, "" for none."""
    if not gpus:
        return ""
    for i in range(gpus):
        (root / "dev" / f"nvidia{i}").symlink_to("/dev/null")
    last = gpus - 1
    files = f"{root / 'dev'}/nvidia[0-{last}]" if last else f"{root / 'dev'}/nvidia0"
    (root / "gres.conf").write_text(f"Name=gpu File={files}\n", encoding="utf-8")
    return f"Gres=gpu:{gpus} "


class Cluster:
    """The running cluster; ``env`` points Slurm's client commands at it."""

    def __init__(self, root: Path, gpus: int = 0) -> None:
        install()
        self.root = root
        host = socket.gethostname()
        for sub in ("state", "spool", "dev"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        gres = _fake_gpus(root, gpus)
        conf = root / "slurm.conf"
        conf.write_text(
            "\n".join(
                [
                    "ClusterName=spectooltest",
                    f"SlurmctldHost={host}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    f"StateSaveLocation={root / 'state'}",
                    f"SlurmdSpoolDir={root / 'spool'}",
                    f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                    f"SlurmdPidFile={root / 'slurmd.pid'}",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SchedulerType=sched/builtin",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "ReturnToService=2",
                    "MpiDefault=none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "MinJobAge=2",
                    f"SlurmctldLogFile={root / 'slurmctld.log'}",
                    f"SlurmdLogFile={root / 'slurmd.log'}",
                    *(["GresTypes=gpu"] if gpus else []),
                    f"NodeName={host} CPUs={os.cpu_count()} {gres}State=UNKNOWN",
                    f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            ),
            encoding="utf-8",
        )
        self.env = {**os.environ, "SLURM_CONF": str(conf)}
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "munged"], check=True)
        subprocess.run(["slurmctld", "-f", str(conf)], check=True, env=self.env)
        subprocess.run(["slurmd", "-f", str(conf)], check=True, env=self.env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=self.env
            )
            if out.stdout.strip() == "idle":
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the test Slurm cluster did not come up: see {root}/*.log")

    def jobs(self) -> list[str]:
        """Job ids squeue lists."""
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=self.env, check=True
        )
        return out.stdout.split()

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "-u", "root"], capture_output=True, env=self.env)
        for name in ("slurmd", "slurmctld"):
            pid_file = self.root / f"{name}.pid"
            if pid_file.is_file():
                try:
                    os.kill(int(pid_file.read_text().strip()), 15)
                except (ProcessLookupError, ValueError):
                    pass
