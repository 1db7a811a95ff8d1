"""``trtllm-serve`` servers for ``tune``: one per configuration, configured by ``spectool build``.

For every draft length ``k >= 1`` measured, ``build``'s own code (:mod:`spectool.deploy.build`:
check, fit to the GPU, render, validate, write) writes a build folder ``DIR/configs/k<k>`` for
the pair at ``max_draft_len = k`` with no runtime gate, and the server runs its
``speculative.yaml``; the baseline (``k = 0``) runs ``baseline.yaml`` of the largest ``k``'s
folder (same limits, no ``speculative_config``), each as ``measuring-<file>``: the same options
with KV-cache block reuse off (:func:`spectool.trtllm.spec_yaml.measuring_yaml`: every block
resends the workload's prompts, which users' traffic does not). The command line comes from
:func:`spectool.deploy.launch.trtllm_server_argv`, as ``spectool serve`` builds it, on a free
port of 127.0.0.1. Each server is a child in its own process group
(:mod:`spectool.deploy.supervise`), logging to ``DIR/logs/trtllm-k<k>.log``.

GPU sets (``--gpus``, :mod:`spectool.tuning.gpu_sets`): with one, one server runs at a time
(:meth:`TrtllmDriver.serve`: the one running is stopped before the next starts). With two or
more, the baseline holds set 0 for the whole run and the speculative servers the others
(:meth:`TrtllmDriver.serve_pair`); :meth:`TrtllmDriver.prefetch` starts the servers the search
will need next on free sets so that their loading overlaps the measuring. Every start is kept
(:attr:`TrtllmDriver.servers`: set, load time, lifetime) with the draft lengths the cells asked
for in order (:attr:`TrtllmDriver.demand`), from which :mod:`spectool.tuning.side_by_side`
counts the wall time saved against restarting one server per configuration.

Iteration stats: the rendered YAML turns on ``enable_iter_perf_stats``, so ``/metrics`` gives
step times and ``specDecodingStats`` (acceptance length, not per position: ``tune`` then fits a
constant acceptance rate to it).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spectool.deploy import supervise
from spectool.deploy.supervise import HealthWait
from spectool.tuning.driver import ServerInfo
from spectool.tuning.gpu_sets import GpuSets
from spectool.tuning.request import ResolvedTune

HOST = "127.0.0.1"


@dataclass
class _Server:
    """One server started: its draft length, GPU set, process and lifetime."""

    k: int
    index: int
    proc: subprocess.Popen[Any]
    url: str
    name: str
    log_path: Path
    model: str
    spawned_at: float = field(default_factory=time.time)
    ready_s: float | None = None  # its load time, once tune has waited for it
    stopped_at: float | None = None
    health: HealthWait | None = None  # how its /health watch ended (see watch)
    watcher: threading.Thread | None = None
    stopping: threading.Event = field(default_factory=threading.Event)

    def watch(self, timeout_s: float) -> None:
        """Poll ``/health`` from the moment the server is spawned, in a thread of its own, so
        its load time is its own even when nobody waits for it yet (a prefetched server)."""

        def run() -> None:
            self.health = supervise.poll_health(
                self.url + "/health",
                timeout_s=timeout_s,
                exit_code=self.proc.poll,
                stopped=self.stopping.is_set,
            )

        self.watcher = threading.Thread(target=run, name=f"health {self.name}", daemon=True)
        self.watcher.start()

    def info(self, ready_s: float) -> ServerInfo:
        return ServerInfo(self.url, self.model, self.k, ready_s)

    def to_json(self) -> dict[str, object]:
        return {
            "k": self.k,
            "gpu_set": self.index,
            "started_at": round(self.spawned_at, 3),
            "load_s": None if self.ready_s is None else round(self.ready_s, 3),
            "stopped_at": None if self.stopped_at is None else round(self.stopped_at, 3),
        }


class TrtllmDriver:
    """TensorRT-LLM servers at any ``k``; see the module docstring."""

    engine = "trtllm"
    interleaves = False  # a new draft length is a server restart (minutes): bracket or pair

    def __init__(self, resolved: ResolvedTune, *, configs_dir: Path, log_dir: Path) -> None:
        from spectool.deploy.build import model_ref
        from spectool.trtllm.launch import find_trtllm_serve

        self.resolved = resolved
        self.configs_dir = configs_dir
        self.log_dir = log_dir
        self.executable = find_trtllm_serve()  # EngineMissingError with the install hint
        self.model_name = model_ref(resolved.report.target)
        self._plans: dict[int, Any] = {}
        self.sets = resolved.gpu_sets or GpuSets("local", resolved.request.tp, ((),))
        self._slots: list[_Server | None] = [None] * self.sets.count
        self._used: dict[int, float] = {}
        self._leftovers: list[str] = []
        self.starts = 0
        self.servers: list[_Server] = []  # every server started, in order
        self.demand: list[int] = []  # the k each cell asked for, in order (the ledger's input)
        self.wait_s = 0.0  # seconds tune was blocked waiting for servers to load
        from spectool.trtllm.gates import gate_support

        # The gate table's row for what is measured: tune's servers run without a runtime gate;
        # a decision's gate only takes effect in a build where this row says the release honours it.
        t = resolved.report.trtllm or {}
        self.gate = gate_support(
            t.get("release", "main"), resolved.method, backend=t.get("backend", "pytorch")
        )

    def build_dir(self, k: int) -> Path:
        """The build folder serving ``k`` (the baseline uses the largest ``k``'s)."""
        return self.configs_dir / f"k{k if k > 0 else self.resolved.max_draft_len}"

    def _plan(self, k: int) -> Any:
        """Write (once) the build folder for draft length ``k`` with build's code."""
        from spectool.deploy.build import check_build, plan_build, run_engine_steps, write_build
        from spectool.errors import IncompatibleError

        k_build = k if k > 0 else self.resolved.max_draft_len
        if k_build in self._plans:
            return self._plans[k_build]
        inputs = check_build(
            self.resolved.build_request(self.build_dir(k_build), max_draft_len=k_build)
        )
        if inputs.report.errors:
            problems = "; ".join(f.message for f in inputs.report.errors)
            raise IncompatibleError(f"cannot build k={k_build}: {problems}")
        plan = plan_build(inputs)
        write_build(plan, force=True)
        if plan.steps:
            run_engine_steps(plan)
        self._plans[k_build] = plan
        return plan

    def serve(self, k: int) -> ServerInfo:
        """A ``trtllm-serve`` running draft length ``k`` on set 0; the one running there is
        stopped first (one server at a time: the bracketed design)."""
        self.demand.append(k)
        current = self._slots[0]
        if current is not None and current.k == k:
            return current.info(0.0)
        self._spawn(k, 0)
        return self._ready([0])[0]

    def serve_baseline(self) -> ServerInfo:
        """The baseline server on set 0 (two sets or more: it stays up for the whole run)."""
        return self.serve(0)

    def serve_pair(self, k: int) -> tuple[ServerInfo, ServerInfo]:
        """The baseline on set 0 and draft length ``k`` on another set, both up at once (two
        sets or more); servers not yet running are started together and waited for together."""
        assert self.sets.concurrent, "serve_pair needs two GPU sets or more"
        self.demand.append(k)
        if self._slots[0] is None or self._slots[0].k != 0:
            self._spawn(0, 0)
        index = self._slot_for(k)
        if self._slots[index] is None or self._slots[index].k != k:  # type: ignore[union-attr]
            self._spawn(k, index)
        self._used[index] = time.monotonic()
        base, spec = self._ready([0, index])
        return base, spec

    def prefetch(self, ks: Sequence[int]) -> None:
        """Start servers for the draft lengths ``ks`` (in order of need) on free speculative
        sets without waiting for them: their loading overlaps the measuring."""
        if not self.sets.concurrent:
            return
        for k in dict.fromkeys(k for k in ks if k > 0):
            if any(s is not None and s.k == k for s in self._slots[1:]):
                continue
            free = [i for i in range(1, self.sets.count) if self._slots[i] is None]
            if not free:
                return
            self._spawn(k, free[0])

    def _slot_for(self, k: int) -> int:
        """The speculative set that runs ``k``, else an empty one, else the least recently
        used."""
        ids = range(1, self.sets.count)
        for i in ids:
            if self._slots[i] is not None and self._slots[i].k == k:  # type: ignore[union-attr]
                return i
        empty = [i for i in ids if self._slots[i] is None]
        return empty[0] if empty else min(ids, key=lambda i: self._used.get(i, 0.0))

    def _spawn(self, k: int, index: int) -> None:
        """Start the server for ``k`` on set ``index`` (the one there is stopped first)."""
        from spectool.deploy.launch import trtllm_server_argv
        from spectool.deploy.manifest import CONFIG_FILES
        from spectool.deploy.supervise import free_port
        from spectool.io import atomic_write_text
        from spectool.trtllm.spec_yaml import measuring_yaml
        from spectool.tuning.gpu_sets import server_command

        self._stop(index)
        plan = self._plan(k)
        manifest = plan.manifest
        assert manifest.trtllm is not None
        spec_name, base_name = CONFIG_FILES["trtllm"]
        release, backend = manifest.trtllm.release, manifest.trtllm.backend
        built = spec_name if k > 0 else base_name
        measuring = f"measuring-{built}"  # block reuse off (spec_yaml.measuring_yaml)
        atomic_write_text(plan.out / measuring, measuring_yaml(plan.out / built, release, backend))
        port = free_port(HOST)
        argv = trtllm_server_argv(
            release=release,
            backend=backend,
            target_model=self.model_name,
            build_dir=plan.out,
            config_name=measuring,
            speculative=k > 0,
            tp=manifest.tp,
            host=HOST,
            port=port,
            executable=self.executable,
        )
        argv, env = server_command(argv, self.sets, index)
        name = f"trtllm-serve (k={k})"
        log_path = self.log_dir / f"trtllm-k{k}.log"
        proc = supervise.spawn(argv, name=name, log_path=log_path, env=env)
        server = _Server(k, index, proc, f"http://{HOST}:{port}", name, log_path, self.model_name)
        server.watch(self.resolved.ready_timeout_s)
        self._slots[index] = server
        self.servers.append(server)

    def _ready(self, indices: Sequence[int]) -> list[ServerInfo]:
        """Wait until the servers on ``indices`` answer ``/health``; their infos (``ready_s``:
        the server's own load time, from spawn to its first 200, when tune waits for it the
        first time, else 0). A server that exits or is not ready in ``--ready-timeout`` is
        :class:`~spectool.errors.ChildProcessError_` with its log's tail, as ``serve`` words it."""
        waited = time.monotonic()
        infos = []
        try:
            for i in indices:
                server = self._slots[i]
                assert server is not None
                assert server.watcher is not None
                if server.ready_s is not None:
                    infos.append(server.info(0.0))
                    continue
                server.watcher.join()
                health = server.health
                assert health is not None
                url = server.url + "/health"
                if health.outcome == "exited":
                    what = f"exited with code {health.exit_code} before {url} answered"
                    raise supervise.log_failure(server.name, what, server.log_path)
                if health.outcome != "ready":
                    what = (
                        f"not ready after {self.resolved.ready_timeout_s:.0f} s ({url}: "
                        f"{health.last}); raise --ready-timeout if the model is still loading"
                    )
                    raise supervise.log_failure(server.name, what, server.log_path)
                server.ready_s = health.waited_s
                self.starts += 1
                infos.append(server.info(server.ready_s))
        except BaseException:
            for i in indices:
                self._stop(i)
            raise
        finally:
            self.wait_s += time.monotonic() - waited
        return infos

    def _stop(self, index: int) -> None:
        server, self._slots[index] = self._slots[index], None
        if server is None:
            return
        server.stopping.set()
        supervise.stop(server.proc)
        if server.watcher is not None:
            server.watcher.join()
        server.stopped_at = time.time()
        if self.sets.launcher == "slurm":
            from spectool.tuning.gpu_sets import cancel_leftovers, job_name

            left = cancel_leftovers(job_name(index))
            if left:
                self._leftovers += left

    def close(self) -> None:
        """Stop every server (their process groups; under Slurm, until squeue lists none), all
        at once: each stop waits for its own server."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=self.sets.count) as pool:
            list(pool.map(self._stop, range(self.sets.count)))
        if self._leftovers:
            from spectool.errors import ChildProcessError_

            left, self._leftovers = self._leftovers, []
            raise ChildProcessError_(f"Slurm still lists {', '.join(left)} after scancel")

    def __enter__(self) -> TrtllmDriver:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
