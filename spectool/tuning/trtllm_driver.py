"""``trtllm-serve`` servers for ``tune``: one per configuration, configured by ``spectool build``.

For every draft length ``k >= 1`` measured, ``build``'s own code (:mod:`spectool.deploy.build`:
check, fit to the GPU, render, validate, write) writes a build folder ``DIR/configs/k<k>`` for
the pair at ``max_draft_len = k`` with no runtime gate, and the server runs its
``speculative.yaml``; the baseline (``k = 0``) runs ``baseline.yaml`` of the largest ``k``'s
folder (same limits, no ``speculative_config``). The command line comes from
:func:`spectool.deploy.launch.trtllm_server_argv`, as ``spectool serve`` builds it, on a free
port of 127.0.0.1. Each server is a child in its own process group
(:mod:`spectool.deploy.supervise`), logging to ``DIR/logs/trtllm-k<k>.log``, stopped as a group before the next one starts.

Iteration stats: the rendered YAML turns on ``enable_iter_perf_stats``, so ``/metrics`` gives
step times and ``specDecodingStats`` (acceptance length, not per position: ``tune`` then fits a
constant acceptance rate to it).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from spectool.deploy import supervise
from spectool.tuning.driver import ServerInfo
from spectool.tuning.request import ResolvedTune

HOST = "127.0.0.1"


class TrtllmDriver:
    """TensorRT-LLM servers at any ``k``; see the module docstring."""

    engine = "trtllm"
    interleaves = False  # a new draft length is a server restart (minutes): bracket instead

    def __init__(self, resolved: ResolvedTune, *, configs_dir: Path, log_dir: Path) -> None:
        from spectool.deploy.build import model_ref
        from spectool.trtllm.launch import find_trtllm_serve

        self.resolved = resolved
        self.configs_dir = configs_dir
        self.log_dir = log_dir
        self.executable = find_trtllm_serve()  # EngineMissingError with the install hint
        self.model_name = model_ref(resolved.report.target)
        self._proc: subprocess.Popen[Any] | None = None
        self._current: ServerInfo | None = None
        self._plans: dict[int, Any] = {}
        self.starts = 0
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
        """A ``trtllm-serve`` running draft length ``k``; the running one is stopped first."""
        from spectool.deploy.launch import trtllm_server_argv
        from spectool.deploy.manifest import CONFIG_FILES
        from spectool.deploy.supervise import free_port

        if self._current is not None and self._current.k == k:
            return ServerInfo(self._current.base_url, self.model_name, k, 0.0)
        self._stop()
        plan = self._plan(k)
        manifest = plan.manifest
        assert manifest.trtllm is not None
        spec_name, base_name = CONFIG_FILES["trtllm"]
        port = free_port(HOST)
        argv = trtllm_server_argv(
            release=manifest.trtllm.release,
            backend=manifest.trtllm.backend,
            target_model=self.model_name,
            build_dir=plan.out,
            config_name=spec_name if k > 0 else base_name,
            speculative=k > 0,
            tp=manifest.tp,
            host=HOST,
            port=port,
            executable=self.executable,
        )
        name = f"trtllm-serve (k={k})"
        log_path = self.log_dir / f"trtllm-k{k}.log"
        self._proc = supervise.spawn(argv, name=name, log_path=log_path)
        url = f"http://{HOST}:{port}"
        try:
            ready_s = supervise.wait_healthy(
                url,
                self._proc,
                name=name,
                log_path=log_path,
                timeout_s=self.resolved.ready_timeout_s,
            )
        except BaseException:
            self._stop()
            raise
        self.starts += 1
        self._current = ServerInfo(url, self.model_name, k, ready_s)
        return self._current

    def _stop(self) -> None:
        proc, self._proc, self._current = self._proc, None, None
        if proc is not None:
            supervise.stop(proc)

    def close(self) -> None:
        """Stop the running server's process group."""
        self._stop()

    def __enter__(self) -> TrtllmDriver:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
