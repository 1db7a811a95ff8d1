"""The server command for a build: ``trtllm-serve`` or spectool's own server, as an argv list.

Why here: ``build`` records these command lines in the manifest (with the default address) and
``serve`` runs them (with the address asked for and any pass-through arguments), so both must
come from one place. Never a shell string.

* TensorRT-LLM: ``trtllm-serve MODEL --config DIR/<speculative|baseline>.yaml --host H --port P
  [--tp_size N]`` (per-release flags from :func:`spectool.trtllm.launch.build_serve_argv`). MODEL
  is the target (PyTorch backend) or the engine folder (legacy TensorRT backend, with
  ``--tokenizer`` the target).
* Embedded engine: ``spectool serve TARGET [DRAFTER] --engine torch --engine-config
  DIR/<speculative|baseline>.json --host H --port P``: the child reads the build's file itself.

:func:`prepare_serve` puts a build folder's serving together: the manifest checked against this
machine (:mod:`spectool.deploy.machine`), the cost gate (:mod:`spectool.deploy.gate`) choosing the
speculative or the baseline config, and the resulting command; running it is
:mod:`spectool.deploy.supervise`'s job.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectool import methods
from spectool.deploy.decision import Decision, parse_decision
from spectool.deploy.engine_config import read_engine_config
from spectool.deploy.gate import GateDecision, RuntimeGate, decide_speculation
from spectool.deploy.machine import MachineFacts
from spectool.deploy.manifest import Manifest, read_manifest
from spectool.errors import BadInputError, BuildMismatchError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
SPECTOOL_ARGV = ("spectool",)
ENGINE_DIR = "engine"
BASELINE_ENGINE_DIR = "baseline-engine"


def spectool_child_prefix() -> tuple[str, ...]:
    """How ``serve`` starts spectool itself as a child: this interpreter, ``-m`` the CLI."""
    return (sys.executable, "-m", "spectool.cli.app")


def torch_server_argv(
    prefix: Sequence[str],
    target: str,
    drafter: str | None,
    method: str,
    config_path: Path,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    extra: Sequence[str] = (),
) -> list[str]:
    """``spectool serve`` argv for the embedded engine running the build's config file
    (``speculative.json`` / ``baseline.json``, read by the child as it is: ``--engine-config``);
    ``method`` is the file's, which says whether the drafter is passed."""
    argv = [*prefix, "serve", target]
    if methods.get(method).takes_drafter:
        assert drafter is not None, f"{method} needs a drafter"
        argv.append(drafter)
    argv += ["--engine", "torch", "--engine-config", str(config_path)]
    argv += ["--host", host, "--port", str(port), *extra]
    return argv


def trtllm_server_argv(
    *,
    release: str,
    backend: str,
    target_model: str,
    build_dir: Path,
    config_name: str,
    speculative: bool,
    tp: int,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    executable: str = "trtllm-serve",
    extra: Sequence[str] = (),
    layout_flags: Sequence[str] = (),
) -> list[str]:
    """``trtllm-serve`` argv serving ``build_dir/config_name`` (see the module docstring);
    ``layout_flags`` (a parallel layout's ``serve_flags()``) replace ``--tp_size``."""
    from spectool.trtllm.launch import build_serve_argv

    legacy = backend == "tensorrt"
    model = (
        str(build_dir / (ENGINE_DIR if speculative else BASELINE_ENGINE_DIR))
        if legacy
        else target_model
    )
    argv = build_serve_argv(
        model,
        release=release,
        backend=backend,
        config_path=build_dir / config_name,
        host=host,
        port=port,
        executable=executable,
        tokenizer=target_model if legacy else None,
        tp_size=tp if tp > 1 and not layout_flags else None,
        parallel_flags=layout_flags,
    )
    return [*argv, *extra]


@dataclass(frozen=True)
class ServeCommand:
    """The child to run: its argv, the config file it serves and whether that speculates."""

    argv: tuple[str, ...]
    config_file: str
    speculative: bool
    engine: str


def serve_command(
    build_dir: Path,
    manifest: Manifest,
    *,
    speculative: bool,
    host: str,
    port: int,
    extra: Sequence[str] = (),
    trtllm_serve: str = "trtllm-serve",
    torch_config: Mapping[str, Any] | None = None,
) -> ServeCommand:
    """The command serving ``build_dir`` with (``speculative``) or without speculation.

    ``torch_config`` is the checked ``speculative.json``/``baseline.json`` of the embedded
    engine (its method decides whether the drafter is passed); ``trtllm_serve`` the resolved
    ``trtllm-serve`` path.
    """
    spec_name, base_name = manifest.config_files
    name = spec_name if speculative else base_name
    if manifest.engine == "torch":
        assert torch_config is not None, "the embedded engine's config file is needed"
        drafter = manifest.drafter.ref if manifest.drafter is not None else None
        argv = torch_server_argv(
            spectool_child_prefix(),
            manifest.target.ref,
            drafter,
            str(torch_config["method"]),
            build_dir / name,
            host=host,
            port=port,
            extra=extra,
        )
    else:
        assert manifest.trtllm is not None
        argv = trtllm_server_argv(
            release=manifest.trtllm.release,
            backend=manifest.trtllm.backend,
            target_model=manifest.target.ref,
            build_dir=build_dir,
            config_name=name,
            speculative=speculative,
            tp=manifest.tp,
            host=host,
            port=port,
            executable=trtllm_serve,
            extra=extra,
            layout_flags=manifest.parallel.serve_flags if manifest.parallel else (),
        )
    return ServeCommand(tuple(argv), name, speculative, manifest.engine)


@dataclass(frozen=True)
class ServePlan:
    """What ``serve`` will run for a build folder, and why (the cost gate's decision)."""

    build_dir: Path
    manifest: Manifest
    gate: GateDecision
    command: ServeCommand
    warnings: tuple[str, ...]


def _decision_of(manifest: Manifest) -> Decision | None:
    record = manifest.decision
    if record is None:
        return None
    data = record.model_dump(exclude={"source", "sha256"})
    return parse_decision(data, "manifest.json: decision")


def prepare_serve(
    build_dir: str | Path,
    *,
    engine: str | None = None,
    speculation: str = "auto",
    expected_concurrency: int | None = None,
    expected_rate: float | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    extra: Sequence[str] = (),
    facts: MachineFacts | None = None,
    trtllm_serve: str | None = None,
    launcher: str = "local",
) -> ServePlan:
    """Check a build folder against this machine, apply the cost gate, and build the command.

    Raises :class:`BadInputError` (not a build, wrong ``engine``),
    :class:`EngineMissingError` (no ``trtllm-serve``; checked first, with the install hint) and
    :class:`BuildMismatchError` listing every mismatch (GPU, TensorRT-LLM, engines, models).
    ``facts`` (this machine) and ``trtllm_serve`` (its path) are looked up when None.
    ``launcher``: ``local`` runs the command here (single-node builds only); ``slurm`` runs it as
    a batch job on the cluster's nodes (:mod:`spectool.deploy.slurm`) and ``mpirun`` under
    ``mpirun`` on the hosts of ``HOSTFILE`` (or this host), so this machine's GPUs and
    ``trtllm-serve`` are not checked: the ranks' hosts check them.
    """
    from spectool.deploy.machine import (
        MachineCheck,
        changed_files,
        checkpoint_problems,
        current_machine,
        engine_dir_problems,
        machine_problems,
    )

    build_dir = Path(build_dir).expanduser().resolve()
    manifest = read_manifest(build_dir)
    if engine is not None and engine != manifest.engine:
        raise BadInputError(
            "--engine", f"{build_dir} was built for engine {manifest.engine}, not {engine}"
        )
    layout = manifest.parallel
    if layout is not None and layout.nodes > 1 and launcher == "local":
        # one trtllm-serve here cannot start ranks on other nodes; Slurm or the launch files can
        raise BuildMismatchError(
            f"{build_dir} was built for {layout.nodes} nodes x {layout.gpus_per_node} GPUs "
            f"(TP {layout.tp} x PP {layout.pp}); serve it with --launcher slurm or --launcher "
            "mpirun and HOSTFILE (or `sbatch "
            f"{build_dir / 'launch.slurm'}`), or start `HOSTFILE=... bash "
            f"{build_dir / 'launch-mpirun.sh'}`"
        )
    if launcher in ("slurm", "mpirun"):
        # The ranks' hosts run it: this machine sees only the checkpoints (a shared filesystem);
        # the GPUs, TensorRT-LLM and trtllm-serve are the nodes', checked there by trtllm-serve.
        trtllm_serve = trtllm_serve or "trtllm-serve"
        check = MachineCheck(tuple(checkpoint_problems(manifest)), ())
        errors = list(check.errors)
    else:
        if manifest.engine == "trtllm" and trtllm_serve is None:
            from spectool.trtllm.launch import find_trtllm_serve

            trtllm_serve = find_trtllm_serve()
        facts = current_machine() if facts is None else facts
        check = machine_problems(manifest, facts)
        errors = list(check.errors) + engine_dir_problems(build_dir, manifest, facts)
    if errors:
        raise BuildMismatchError(f"{build_dir} does not fit this machine: " + "; ".join(errors))
    warnings = list(check.warnings)
    changed = changed_files(build_dir, manifest)
    if changed:
        warnings.append(
            f"{', '.join(changed)} changed since the build (sha256 differs from manifest.json); "
            "serving the files as they are"
        )
    runtime_gate = (
        RuntimeGate(manifest.runtime_gate.kind, manifest.runtime_gate.off_above)
        if manifest.runtime_gate is not None
        else None
    )
    inert = _inert_gate_reason(manifest)
    if runtime_gate is not None and inert is not None:
        warnings.append(f"the build's {runtime_gate.kind} is not relied on: {inert}")
        runtime_gate = None
    gate = decide_speculation(
        speculation,
        _decision_of(manifest),
        expected_concurrency=expected_concurrency,
        runtime_gate=runtime_gate,
        expected_rate=expected_rate,
    )
    spec_name, base_name = manifest.config_files
    name = spec_name if gate.speculate else base_name
    torch_config = read_engine_config(build_dir / name) if manifest.engine == "torch" else None
    command = serve_command(
        build_dir,
        manifest,
        speculative=gate.speculate,
        host=host,
        port=port,
        extra=extra,
        trtllm_serve=trtllm_serve or "trtllm-serve",
        torch_config=torch_config,
    )
    return ServePlan(build_dir, manifest, gate, command, tuple(warnings))


def _inert_gate_reason(manifest: Manifest) -> str | None:
    """Why the manifest's runtime gate would do nothing on its release (None: it works).

    The cost gate never relies on a gate the gate table (:mod:`spectool.trtllm.gates`) says the
    release ignores, e.g. a build written before the table existed.
    """
    record = manifest.runtime_gate
    if record is None or manifest.engine != "trtllm" or manifest.trtllm is None:
        return None
    from spectool.trtllm.gates import gate_support, two_model_key

    release = manifest.trtllm.release
    two_model = record.drafter_path == "two_model" and two_model_key(release, manifest.method)
    support = gate_support(
        release, manifest.method, backend=manifest.trtllm.backend, two_model=bool(two_model)
    )
    return None if support.honours(record.kind) else support.describe()
