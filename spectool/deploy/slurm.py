"""``spectool serve BUILD --launcher slurm``: the build's ``trtllm-serve`` as a Slurm batch job.

What it does, in order:

1. the batch script is :func:`spectool.deploy.launch_files.slurm_script` for the command
   ``serve`` chose (the cost gate's config file, the address asked for): ``srun --mpi=pmix
   trtllm-llmapi-launch trtllm-serve ...`` on the build's layout, as TensorRT-LLM's
   ``examples/llm-api/llm_mgmn_trtllm_serve.sh`` runs it; it is handed to ``sbatch --parsable`` on
   standard input (no file written), from the build folder, so the job's output lands in
   ``BUILD/spectool-serve-<job>.out``, which ``serve`` streams to the terminal;
2. readiness: ``GET /health`` on the head rank (the job's batch host when the server binds every
   address, else the host it was given) until 200, or until the job leaves the queue;
3. Ctrl-C or SIGTERM: ``scancel`` the job, then wait until ``squeue`` no longer lists it (Slurm
   signals and kills every task of every step: no process is left behind); the same on every
   other way out (the job failing, a timeout, an error in spectool).

``trtllm-llmapi-launch`` runs the command on rank 0 and an MPI worker on every other rank
(TensorRT-LLM ``tensorrt_llm/llmapi/trtllm-llmapi-launch`` @ 020c89e64e49: the rank is
``SLURM_PROCID``), so the server is on the first node of the allocation, the batch host.
Slurm's commands run without a shell; a missing ``sbatch`` is exit 2 naming the command.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from spectool.deploy.supervise import TAIL_LINES, _SignalForwarder, poll_health
from spectool.errors import BadInputError, ChildProcessError_

if TYPE_CHECKING:
    from spectool.deploy.launch import ServePlan
    from spectool.parallel import ParallelLayout

OUTPUT_PATTERN = "spectool-serve-{job}.out"  # the script's #SBATCH --output, %j expanded
ENDED_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}
)
GONE_TIMEOUT_S = 10.0  # after scancel, the job must leave the queue within this
POLL_S = 0.25
ANY_ADDRESS = ("0.0.0.0", "::", "")  # noqa: S104 (recognised, never bound)


@dataclass(frozen=True)
class SlurmJob:
    """A submitted job: its id and the folder its output file is written to."""

    job_id: str
    workdir: Path

    @property
    def output(self) -> Path:
        return self.workdir / OUTPUT_PATTERN.format(job=self.job_id)


def _slurm(argv: list[str], *, stdin: str | None = None, cwd: Path | None = None) -> str:
    """Run a Slurm command; its stdout. A missing command is exit 2, a failing one exit 3."""
    if shutil.which(argv[0]) is None:
        raise BadInputError(
            "--launcher slurm", f"{argv[0]} not found on PATH: Slurm's client commands are needed"
        )
    done = subprocess.run(  # noqa: S603 (a fixed Slurm command, no shell)
        argv, input=stdin, cwd=cwd, capture_output=True, text=True, check=False, timeout=60
    )
    if done.returncode != 0:
        raise ChildProcessError_(f"{' '.join(argv[:2])} failed: {done.stderr.strip()}")
    return done.stdout


def submit(script: str, workdir: Path) -> SlurmJob:
    """``sbatch --parsable`` with ``script`` on standard input, run from ``workdir``."""
    out = _slurm(["sbatch", "--parsable"], stdin=script, cwd=workdir).strip()
    job_id = out.split(";")[0]  # "ID" or "ID;cluster"
    if not job_id.isdigit():
        raise ChildProcessError_(f"sbatch answered {out!r}, not a job id")
    return SlurmJob(job_id, workdir)


def _queue(job: SlurmJob) -> tuple[str | None, str | None]:
    """The job's state and batch host (rank 0's node) as one ``squeue`` reports them; ``(None,
    None)`` once the job has left the queue (squeue then fails with "Invalid job id")."""
    done = subprocess.run(  # noqa: S603
        ["squeue", "-h", "-j", job.job_id, "-o", "%T %B"],  # noqa: S607
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    fields = done.stdout.split()
    state = fields[0] if fields else None
    host = fields[1] if len(fields) > 1 and fields[1] not in ("n/a", "(null)") else None
    return state, host


def _over(state: str | None) -> bool:
    """Whether a job in ``state`` (None: gone from the queue) has ended."""
    return state is None or state in ENDED_STATES


def cancel(job: SlurmJob, timeout_s: float = GONE_TIMEOUT_S) -> bool:
    """``scancel`` the job; whether it left the queue within ``timeout_s``."""
    subprocess.run(  # noqa: S603
        ["scancel", job.job_id],  # noqa: S607
        capture_output=True,
        check=False,
        timeout=60,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _over(_queue(job)[0]):
            return True
        time.sleep(POLL_S)
    return False


class _Follow(threading.Thread):
    """Streams the job's output file to ``on_output`` as it grows; keeps the last lines."""

    def __init__(self, path: Path, on_output: Callable[[str], None] | None) -> None:
        super().__init__(name="slurm-output", daemon=True)
        self.path, self.on_output = path, on_output
        self.lines: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        handle = None
        try:
            while not self.stop.is_set():
                if handle is None and self.path.is_file():
                    handle = self.path.open(encoding="utf-8", errors="replace")
                line = handle.readline() if handle is not None else ""
                if not line:
                    self.stop.wait(POLL_S)
                    continue
                self.lines = [*self.lines[-(TAIL_LINES - 1) :], line.rstrip("\n")]
                if self.on_output is not None:
                    self.on_output(line.rstrip("\n"))
        finally:
            if handle is not None:
                handle.close()

    def tail(self) -> str:
        return "\n".join(self.lines)


class _Stop(_SignalForwarder):
    """While active, SIGINT/SIGTERM to spectool only record themselves (the caller cancels the
    job); outside the main thread nothing is installed."""

    def __init__(self) -> None:
        super().__init__(pgid=0)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.received = self.received or signum


def serve_slurm(
    script: str,
    *,
    workdir: Path,
    host: str,
    port: int,
    ready_timeout_s: float,
    on_output: Callable[[str], None] | None = None,
    on_submit: Callable[[SlurmJob], None] | None = None,
    on_ready: Callable[[str, float], None] | None = None,
) -> int | None:
    """Submit ``script``, wait for the head rank's ``/health``, serve until the user stops it;
    the signal that stopped it. Raises :class:`ChildProcessError_` (exit 3) with the job's
    output tail when it ends on its own, is not ready in time, or outlives ``scancel``."""
    job = submit(script, workdir)
    if on_submit is not None:
        on_submit(job)
    follow = _Follow(job.output, on_output)
    follow.start()
    gone = False
    try:
        with _Stop() as stop:
            url = _wait_ready(job, host, port, ready_timeout_s, stop, follow)
            if url is not None and on_ready is not None:
                on_ready(url[0], url[1])
            while stop.received is None:
                state = _queue(job)[0]
                if _over(state):
                    raise ChildProcessError_(
                        f"Slurm job {job.job_id} ended ({state or 'left the queue'}) while "
                        f"serving; its output ({job.output}):\n{follow.tail()}"
                    )
                time.sleep(POLL_S)
            gone = cancel(job)
            return stop.received
    finally:
        if not gone and not cancel(job):
            raise ChildProcessError_(f"Slurm job {job.job_id} still queued after scancel")
        time.sleep(POLL_S)  # the last lines Slurm flushes
        follow.stop.set()
        follow.join(timeout=5.0)


def _wait_ready(
    job: SlurmJob, host: str, port: int, timeout_s: float, stop: _Stop, follow: _Follow
) -> tuple[str, float] | None:
    """``(base url, seconds)`` once the head rank answers; None when the user stopped first."""
    start = time.monotonic()
    while True:  # the job may wait in the queue before it runs
        if stop.received is not None:
            return None
        state, head = _queue(job)
        if _over(state):
            raise ChildProcessError_(
                f"Slurm job {job.job_id} ended ({state or 'left the queue'}) before it was "
                f"ready; its output ({job.output}):\n{follow.tail()}"
            )
        if state == "RUNNING" and head is not None:
            break
        if time.monotonic() - start > timeout_s:
            raise ChildProcessError_(
                f"Slurm job {job.job_id} still {state} after {timeout_s:.0f} s"
            )
        time.sleep(POLL_S)
    target = head if host in ANY_ADDRESS else host
    base = f"http://[{target}]:{port}" if ":" in target else f"http://{target}:{port}"

    wait = poll_health(
        base + "/health",
        timeout_s=max(1.0, timeout_s - (time.monotonic() - start)),
        exit_code=lambda: 1 if _over(_queue(job)[0]) else None,
        stopped=lambda: stop.received is not None,
    )
    if wait.outcome == "ready":
        return base, time.monotonic() - start
    if wait.outcome == "stopped":
        return None
    what = "ended" if wait.outcome == "exited" else f"was not ready after {timeout_s:.0f} s"
    raise ChildProcessError_(
        f"Slurm job {job.job_id} {what} ({base}/health: {wait.last}); its output "
        f"({job.output}):\n{follow.tail()}"
    )


def build_layout(plan: ServePlan) -> ParallelLayout:
    """The build's parallel layout (a single-GPU or plain ``--tp`` build: one node, TP ranks)."""
    from spectool.parallel import ParallelLayout

    manifest = plan.manifest
    record = manifest.parallel
    if record is None:
        return ParallelLayout(tp=manifest.tp, gpus_per_node=manifest.tp)
    return ParallelLayout(
        tp=record.tp,
        pp=record.pp,
        ep=record.ep,
        attention_dp=record.attention_dp,
        nodes=record.nodes,
        gpus_per_node=record.gpus_per_node,
    )


def serve_build(
    plan: ServePlan,
    *,
    host: str,
    port: int,
    timeout_s: float,
    echo: Callable[[str], None],
    on_ready: Callable[[str, float], None],
) -> int | None:
    """A build's serve plan (:func:`spectool.deploy.launch.prepare_serve`) as a batch job on the
    build's layout (a single-GPU or plain ``--tp`` build: one node, TP tasks); the signal that
    stopped it."""
    from spectool.deploy.launch_files import slurm_script

    layout = build_layout(plan)
    argv = ["trtllm-serve", *plan.command.argv[1:]]  # found on the nodes' PATH, not this one's
    title = f"spectool serve {plan.build_dir} ({plan.command.config_file})"
    stopped = serve_slurm(
        slurm_script(argv, layout, title=title),
        workdir=plan.build_dir,
        host=host,
        port=port,
        ready_timeout_s=timeout_s,
        on_output=echo,
        on_submit=lambda job: echo(
            f"spectool: submitted Slurm job {job.job_id} ({layout.nodes} node(s) x "
            f"{layout.gpus_per_node} tasks); its output: {job.output}"
        ),
        on_ready=on_ready,
    )
    echo("spectool: Slurm job cancelled (scancel); squeue no longer lists it")
    return stopped
