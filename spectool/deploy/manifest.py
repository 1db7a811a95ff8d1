"""``manifest.json``: what a build folder was made from, for which machine, and how to rerun it.

Why: a build is only valid for the models, engine release and GPU it was fitted to. The manifest
records them (checkpoint config hashes, TensorRT-LLM release and backend, TensorRT version, GPU
name, SM, memory and driver), the sha256 of every file the build wrote, the tune decision it
applied and the command lines that reproduce it; ``serve`` checks it against the machine before
launching. It holds no timestamps, so rebuilding from the same inputs gives the same bytes and an
identical rebuild is recognised as such.

The file is a boundary: read back with pydantic, unknown keys refused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spectool.ckpt.inspect import Checkpoint
from spectool.constants import MAX_JSON_BYTES
from spectool.errors import BadInputError

MANIFEST_NAME = "manifest.json"
FORMAT = "spectool-build/1"
# The configuration files each engine's build writes: (with speculation, without).
CONFIG_FILES: dict[str, tuple[str, str]] = {
    "trtllm": ("speculative.yaml", "baseline.yaml"),
    "torch": ("speculative.json", "baseline.json"),
}
DECISION_NAME = "decision.json"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CheckpointRecord(_Record):
    """A checkpoint as built: ``ref`` reproduces it (a local folder as an absolute path, a repo id
    with its resolved revision), ``path`` is where its metadata was read."""

    ref: str
    path: str | None  # None: not read (a build from a profile's geometry, offline)
    revision: str | None
    architecture: str | None
    kind: str
    config_sha256: str | None


class TrtllmRecord(_Record):
    """The TensorRT-LLM generation targeted. ``version``: the exact version built for (installed
    or ``--trtllm-version``; None: judged against the built-in table of ``release``)."""

    version: str | None
    installed: str | None
    release: str
    backend: Literal["pytorch", "tensorrt"]
    tensorrt_version: str | None


class GpuRecord(_Record):
    """The GPU fitted to. ``name``/``sm``/``memory_gib`` from spectool's GPU table (None for a
    CPU build of the embedded engine); ``device_name``/``driver`` as this machine's driver
    reported them (None: no GPU detected); ``count`` GPUs detected."""

    name: str | None
    sm: int | None
    memory_gib: float | None
    device_name: str | None
    driver: str | None
    count: int = Field(ge=0)


class LimitsRecord(_Record):
    """Limits written into the configs; None where the engine default was kept."""

    max_batch_size: int = Field(ge=1)
    max_seq_len: int = Field(ge=1)
    max_num_tokens: int | None = None
    free_gpu_memory_fraction: float | None = None
    cuda_graph_batch_sizes: tuple[int, ...] | None = None
    # Graph coverage, the same in baseline and speculative configs: padding on with the list
    # (True), or TensorRT-LLM's default list (None: no graph keys written).
    cuda_graph_padding: bool | None = None


class RuntimeGateRecord(_Record):
    """The speculative config switches speculation off by itself above batch ``off_above``.

    ``drafter_path`` is the path the gate was written for (the gate table in
    :mod:`spectool.trtllm.gates` says it is honoured there); None in older manifests.
    """

    kind: Literal["draft_len_schedule", "max_concurrency"]
    off_above: int = Field(ge=1)
    drafter_path: Literal["one_model", "two_model"] | None = None


class EngineStep(_Record):
    """One command of the legacy TensorRT engine build (checkpoint conversion, trtllm-build)."""

    name: str
    argv: tuple[str, ...]


class EngineBuildRecord(_Record):
    """Legacy TensorRT backend: engine folders (relative to the build folder) and their commands.

    An engine only runs on the GPU architecture and TensorRT version it was built with (recorded
    in :class:`GpuRecord` and :class:`TrtllmRecord`). ``runnable`` is False when a step cannot run
    here (e.g. no ``convert_checkpoint.py``); the steps then say what to run.
    """

    engine_dir: str
    baseline_engine_dir: str
    steps: tuple[EngineStep, ...]
    runnable: bool


class DecisionRecord(_Record):
    """The tune decision applied (see :mod:`spectool.deploy.decision`), with its file's hash."""

    source: str
    sha256: str
    engine: str
    method: str
    max_draft_len: int
    schedule: dict[str, int]
    break_even_concurrency: int | None
    cells: tuple[dict[str, Any], ...]
    predicted: bool = False  # tune --predict-only: "predicted, not measured"
    prediction: dict[str, Any] | None = None
    rates: tuple[dict[str, Any], ...] = ()  # tune --request-rate (DecisionRate)
    rates_objective: str | None = None


class ParallelRecord(_Record):
    """A parallel layout beyond plain ``--tp`` (:mod:`spectool.parallel`): the layout, its
    ``trtllm-serve`` flags, memory per pipeline stage (:mod:`spectool.memory_ranks`) and the
    launch files written for it (:mod:`spectool.deploy.launch_files`)."""

    tp: int = Field(ge=1)
    pp: int = Field(ge=1)
    ep: int = Field(ge=1)
    attention_dp: bool
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    world_size: int = Field(ge=1)
    serve_flags: tuple[str, ...]
    per_rank: tuple[dict[str, Any], ...]
    launch_files: tuple[str, ...] = ()


class CommandsRecord(_Record):
    """Command lines: ``build`` reproduces the folder; ``serve``/``serve_baseline`` start the
    server with and without speculation (``spectool serve`` runs them)."""

    build: tuple[str, ...]
    serve: tuple[str, ...]
    serve_baseline: tuple[str, ...]


class Manifest(_Record):
    format: Literal["spectool-build/1"] = FORMAT
    spectool_version: str
    engine: Literal["trtllm", "torch"]
    method: str
    max_draft_len: int = Field(ge=1)
    tp: int = Field(ge=1)
    target: CheckpointRecord
    drafter: CheckpointRecord | None
    gpu: GpuRecord
    trtllm: TrtllmRecord | None
    limits: LimitsRecord
    runtime_gate: RuntimeGateRecord | None
    files: dict[str, str]
    decision: DecisionRecord | None
    engine_build: EngineBuildRecord | None
    notes: tuple[str, ...] = ()
    commands: CommandsRecord
    parallel: ParallelRecord | None = None

    @property
    def config_files(self) -> tuple[str, str]:
        """(speculative, baseline) configuration file names for this build's engine."""
        return CONFIG_FILES[self.engine]

    def to_bytes(self) -> bytes:
        """Stable JSON (field order, 2-space indent, trailing newline)."""
        data = self.model_dump(mode="json")
        if data.get("parallel") is None:  # single-node --tp builds keep their bytes
            data.pop("parallel", None)
        return (json.dumps(data, indent=2) + "\n").encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def model_ref(ckpt: Checkpoint) -> str:
    """What an engine is given for ``ckpt``: its folder, or the repo id (hub references)."""
    from spectool.ckpt.hub import looks_like_repo_id, split_revision

    if not Path(ckpt.ref).expanduser().exists() and looks_like_repo_id(ckpt.ref):
        return split_revision(ckpt.ref)[0]
    return str(ckpt.path)


def reproducible_ref(ckpt: Checkpoint) -> str:
    """``model_ref`` pinned to the resolved revision for hub references."""
    ref = model_ref(ckpt)
    if ref != str(ckpt.path) and ckpt.revision:
        return f"{ref}@{ckpt.revision}"
    return ref


def checkpoint_record(ckpt: Checkpoint, ref: str) -> CheckpointRecord:
    """Record ``ckpt`` under the reproducible ``ref``; hashes its ``config.json``."""
    config = Path(ckpt.path) / "config.json"
    try:
        digest = file_sha256(config)
    except OSError as exc:
        raise BadInputError(config, f"cannot read: {exc.strerror or exc}") from None
    return CheckpointRecord(
        ref=ref,
        path=str(ckpt.path),
        revision=ckpt.revision,
        architecture=ckpt.architecture,
        kind=str(ckpt.kind),
        config_sha256=digest,
    )


def read_manifest(folder: str | Path) -> Manifest:
    """The manifest of build folder ``folder``; :class:`BadInputError` when there is none or it
    is not one spectool can read."""
    folder = Path(folder)
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise BadInputError(
            folder, f"not a spectool build folder (no {MANIFEST_NAME}); run spectool build first"
        )
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise BadInputError(path, f"larger than {MAX_JSON_BYTES} bytes")
        data = json.loads(path.read_bytes())
    except OSError as exc:
        raise BadInputError(path, f"cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInputError(path, f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadInputError(path, "expected a JSON object")
    if data.get("format") != FORMAT:
        raise BadInputError(
            path, f"format {data.get('format')!r} is not {FORMAT!r}; rebuild with this spectool"
        )
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise BadInputError(path, f"invalid manifest at {where}: {err['msg']}") from None
