"""``spectool tune``'s options, checked, with each engine's defaults, resolved against the models.

Defaults per engine (:data:`ENGINE_DEFAULTS`), chosen so that each run is honest and finishes:

* ``torch`` (spectool's embedded engine; CPU unless a GPU is there): concurrencies 1,4,16
  (the server's batch limit is the largest, so the run spans every batch the tuned server can
  run, a factor 4 apart: each concurrency costs a cell per method, and the main job has to
  finish in minutes), 16 requests of 32 output tokens per baseline trial, paired blocks of two
  waves.
* ``trtllm``: concurrencies 1,2,4,8,16,32, 64 requests of 256 tokens: a GPU serves these in
  seconds per cell; server starts (minutes each) dominate.

``--engine auto`` is ``trtllm`` when ``trtllm-serve`` is on ``PATH``, else ``torch``. The pair
is resolved exactly as ``spectool check`` does (profiles, ``spectool:NAME``, the ``demo``
profile with no models at all) and must pass the check for the engine (exit 1 otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spectool import methods
from spectool.check import DEFAULT_MAX_SEQ_LEN as CHECK_DEFAULT_MAX_SEQ_LEN
from spectool.check import CheckReport, PairOptions, run_check
from spectool.decide.verdict import DEFAULT_OBJECTIVE, OBJECTIVES, objective_source
from spectool.errors import BadInputError, IncompatibleError
from spectool.tuning.pairing import DEFAULT_BUDGET_S

if TYPE_CHECKING:
    from spectool.decide.slo import SloTerm
    from spectool.deploy.build import BuildRequest
    from spectool.tuning.gpu_sets import GpuSets

ENGINES = ("auto", "torch", "trtllm")
TORCH_DEFAULT_MAX_SEQ_LEN = 1024
MAX_CONCURRENCY = 4096


@dataclass(frozen=True)
class EngineDefaults:
    """What an option left unset becomes on one engine (see the module docstring)."""

    concurrencies: tuple[int, ...]
    num_prompts: int
    max_tokens: int
    ready_timeout_s: float


ENGINE_DEFAULTS: dict[str, EngineDefaults] = {
    "torch": EngineDefaults((1, 4, 16), num_prompts=16, max_tokens=32, ready_timeout_s=600.0),
    "trtllm": EngineDefaults(
        (1, 2, 4, 8, 16, 32), num_prompts=64, max_tokens=256, ready_timeout_s=1800.0
    ),
}


@dataclass(frozen=True)
class TuneRequest(PairOptions):
    """Everything ``spectool tune`` was asked; None = the engine's default (module docstring).

    The options ``check`` shares come from :class:`~spectool.check.PairOptions` (``gpu`` and
    ``trtllm_*`` apply to TensorRT-LLM only)."""

    engine: str = "auto"
    concurrencies: tuple[int, ...] | None = None
    workload: Path | None = None
    num_prompts: int | None = None
    max_tokens: int | None = None
    repeats: int = 1
    out: Path = Path("tune")
    resume: bool = False
    force: bool = False
    # embedded engine
    device: str = "auto"
    dtype: str = "float32"
    threads: int | None = None
    ready_timeout_s: float | None = None
    # the decision
    confidence: float = 0.95
    n_boot: int = 1000
    seed: int = 0
    min_gain: float = 0.0
    budget_s: float = DEFAULT_BUDGET_S  # per paired cell: blocks until settled or spent
    objective: str = DEFAULT_OBJECTIVE  # what decides (spectool.decide.verdict.OBJECTIVES)
    temperature: float = 0.0  # sampling temperature of every request (0: greedy)
    top_p: float = 1.0  # nucleus sampling of every request without its own (1: off)
    time_scale: float | None = None  # multiplies a trace workload's timestamps (None: not given)
    # after the choice: the deployment against the baseline at these arrival rates (req/s),
    # gamma gaps of shape ``burstiness`` (1: Poisson); spectool.tuning.rates
    request_rates: tuple[float, ...] = ()
    burstiness: float = 1.0
    # after the choice: the highest rate each arm sustains within ``slo`` (spectool.tuning.
    # capacity; terms from spectool.decide.slo.parse_slo)
    capacity: bool = False
    slo: tuple[SloTerm, ...] = ()
    # servers side by side (spectool.tuning.gpu_sets): GPUs tune may use, and how servers start
    gpus: int | None = None  # None: one set, the layout's own GPUs
    launcher: str = "local"


@dataclass(frozen=True)
class ResolvedTune:
    """A request with every default filled in and the pair checked.

    ``target_dir``/``drafter_dir``: local folders the embedded engine loads (None for
    TensorRT-LLM, which is given the references). ``max_draft_len`` is the largest ``k``
    searched. ``max_batch_size``/``max_seq_len``: the server's limits as tune counts with them
    (prompts must fit ``max_seq_len``); ``build_*``: what is passed to ``build``'s code (for
    TensorRT-LLM None unless asked: build fits them to the GPU, so the servers measured are
    the ones ``build`` writes).
    """

    request: TuneRequest
    engine: str
    report: CheckReport
    method: str
    max_draft_len: int
    concurrencies: tuple[int, ...]
    num_prompts: int
    max_tokens: int
    ready_timeout_s: float
    target_dir: Path | None
    drafter_dir: Path | None
    max_batch_size: int
    max_seq_len: int
    build_max_batch_size: int | None
    build_max_seq_len: int | None
    threads: int | None
    gpu_sets: GpuSets | None = None  # TensorRT-LLM: the sets its servers run on (--gpus)

    def build_request(
        self, out: Path, *, max_draft_len: int | None, decision: Path | None = None
    ) -> BuildRequest:
        """The ``spectool build`` request for the checked pair at ``max_draft_len`` into ``out``
        (tune's configs and its final build folder; ``force``: tune owns those folders)."""
        from spectool.deploy.build import BuildRequest

        req, report = self.request, self.report
        drafter = report.drafter.ref if report.drafter is not None else None
        if drafter is None and methods.get(report.method).uses_native_layers:
            drafter = "self"
        return BuildRequest(
            **req.pair_options(
                target=report.target.ref,
                drafter=drafter,
                profile=None,
                method=report.method,
                max_draft_len=max_draft_len,
                gpu=req.gpu if self.engine == "trtllm" else None,
                max_batch_size=self.build_max_batch_size,
                max_seq_len=self.build_max_seq_len,
            ),
            out=out,
            engine=self.engine,
            decision=decision,
            force=True,
        )


def parse_concurrencies(text: str) -> tuple[int, ...]:
    """``"1,2,4,8"`` -> ``(1, 2, 4, 8)``: sorted, unique, each in ``1..MAX_CONCURRENCY``."""
    values: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = int(part)
        except ValueError:
            raise BadInputError("--concurrency", f"{part!r} is not an integer") from None
        if not 1 <= value <= MAX_CONCURRENCY:
            raise BadInputError("--concurrency", f"{value} is outside 1..{MAX_CONCURRENCY}")
        values.add(value)
    if not values:
        raise BadInputError("--concurrency", "give at least one level, e.g. 1,2,4,8")
    return tuple(sorted(values))


def resolve_engine(engine: str) -> str:
    """``auto`` -> ``trtllm`` when ``trtllm-serve`` is on PATH, else ``torch``."""
    if engine not in ENGINES:
        raise BadInputError("--engine", f"expected one of {', '.join(ENGINES)}, got {engine!r}")
    if engine != "auto":
        return engine
    from spectool.errors import EngineMissingError
    from spectool.trtllm.launch import find_trtllm_serve

    try:
        find_trtllm_serve()
    except EngineMissingError:
        return "torch"
    return "trtllm"


def _check_numbers(req: TuneRequest) -> None:
    if req.repeats < 1:
        raise BadInputError("--repeats", f"must be >= 1, got {req.repeats}")
    if req.num_prompts is not None and req.num_prompts < 1:
        raise BadInputError("--num-prompts", f"must be >= 1, got {req.num_prompts}")
    if req.max_tokens is not None and req.max_tokens < 2:
        raise BadInputError(
            "--max-tokens",
            f"must be >= 2 (a single token has no decode step), got {req.max_tokens}",
        )
    if req.max_draft_len is not None and req.max_draft_len < 1:
        raise BadInputError("--max-draft-len", f"must be >= 1, got {req.max_draft_len}")
    if not 0.5 <= req.confidence < 1.0:
        raise BadInputError("--confidence", f"must be in [0.5, 1), got {req.confidence}")
    if req.n_boot < 100:
        raise BadInputError("--n-boot", f"must be >= 100, got {req.n_boot}")
    if not 0.0 <= req.temperature <= 2.0:
        raise BadInputError("--temperature", f"must be in [0, 2], got {req.temperature}")
    if not 0.0 < req.top_p <= 1.0:
        raise BadInputError("--top-p", f"must be in (0, 1], got {req.top_p}")
    if req.time_scale is not None:
        if not req.time_scale > 0:
            raise BadInputError("--time-scale", f"must be > 0, got {req.time_scale}")
        if req.workload is None:
            raise BadInputError(
                "--time-scale", "scales a trace's timestamps; pass the trace as --workload"
            )
    if not req.burstiness > 0:
        raise BadInputError("--burstiness", f"must be > 0, got {req.burstiness}")
    if req.burstiness != 1.0 and not (req.request_rates or req.capacity):
        raise BadInputError(
            "--burstiness", "shapes the arrivals of --request-rate or --capacity; give one"
        )
    if req.capacity and not req.slo:
        raise BadInputError(
            "--capacity", "--capacity finds the highest rate within --slo: give both"
        )
    goodput = objective_source(req.objective) not in OBJECTIVES.values()
    if req.slo and not (req.capacity or goodput):
        raise BadInputError(
            "--slo", "sets the limits of --capacity or of --objective goodput: give one"
        )
    if req.threads is not None and req.threads < 1:
        raise BadInputError("--threads", f"must be >= 1, got {req.threads}")
    if req.ready_timeout_s is not None and not req.ready_timeout_s > 0:
        raise BadInputError("--ready-timeout", f"must be > 0 s, got {req.ready_timeout_s}")
    if req.resume and req.force:
        raise BadInputError("--resume", "--resume continues a run, --force starts over; pick one")


def _local_dir(ref: str, folder: Path, role: str) -> Path:
    """The embedded engine loads weights: the checkpoint must be a local folder or built in."""
    from spectool.ckpt.refs import BUILTIN_PREFIX

    if ref.startswith(BUILTIN_PREFIX) or Path(ref).expanduser().is_dir():
        return Path(folder).resolve()
    raise BadInputError(
        ref,
        f"the torch engine loads a local {role} folder or spectool:NAME; download the "
        "checkpoint first or use --engine trtllm",
    )


def resolve(req: TuneRequest) -> ResolvedTune:
    """Check the options, resolve models and defaults, and run the checker for the engine.

    :class:`BadInputError` (exit 2) for unusable options; :class:`IncompatibleError` (exit 1)
    when the check finds errors.
    """
    _check_numbers(req)
    engine = resolve_engine(req.engine)
    if engine != "torch" and (req.request_rates or req.capacity):
        raise BadInputError(  # before anything is measured (spectool.tuning.deployed)
            "--request-rate" if req.request_rates else "--capacity",
            "runs on the embedded engine (--engine torch) for now: TensorRT-LLM restarts a "
            "server per arm, which open-loop pairs cannot bridge yet",
        )
    from spectool.tuning.gpu_sets import plan_gpu_sets

    sets = plan_gpu_sets(req.gpus, req.launcher, engine=engine, per_server=req.layout().world_size)
    defaults = ENGINE_DEFAULTS[engine]
    concurrencies = req.concurrencies or defaults.concurrencies
    if min(concurrencies) < 1:
        raise BadInputError("--concurrency", "every level must be >= 1")
    report = run_check(req.check_request(engine, gpu=req.gpu if engine == "trtllm" else None))
    if report.errors:
        problems = "; ".join(f"{f.code}: {f.message}" for f in report.errors)
        raise IncompatibleError(f"spectool check found errors, nothing measured: {problems}")
    if report.method == "none":
        raise BadInputError("--method", "tune compares speculation with none; pick a method")
    if report.target is None:  # offline without headers: check predicts, tune builds on them
        raise BadInputError(
            report.profile or req.target or "target",
            "tune needs the checkpoints' headers (pass local folders or run once online); "
            "spectool check --gpu predicts from the profile's geometry offline",
        )
    target_dir = drafter_dir = None
    model_limit = report.target.max_position_embeddings or TORCH_DEFAULT_MAX_SEQ_LEN
    if engine == "torch":
        target_dir = _local_dir(report.target.ref, report.target.path, "target")
        if report.drafter is not None:
            drafter_dir = _local_dir(report.drafter.ref, report.drafter.path, "drafter")
            limit = report.drafter.max_position_embeddings
            model_limit = min(model_limit, limit) if limit else model_limit
        # the tuned server batches up to the largest concurrency measured (written to the build)
        max_batch_size = req.max_batch_size or max(concurrencies)
        max_seq_len = min(req.max_seq_len or TORCH_DEFAULT_MAX_SEQ_LEN, model_limit)
    else:
        max_batch_size = req.max_batch_size or max(concurrencies)
        max_seq_len = req.max_seq_len or min(model_limit, CHECK_DEFAULT_MAX_SEQ_LEN)
    if max_batch_size < max(concurrencies):
        raise BadInputError(
            "--max-batch-size",
            f"{max_batch_size} is below the largest concurrency {max(concurrencies)}: requests "
            "would queue instead of batching",
        )
    threads = None
    if engine == "torch":
        from spectool.tuning.torch_driver import default_threads

        threads = req.threads or default_threads()
    return ResolvedTune(
        request=req,
        engine=engine,
        report=report,
        method=report.method,
        max_draft_len=report.max_draft_len,
        concurrencies=tuple(sorted(set(concurrencies))),
        num_prompts=req.num_prompts or defaults.num_prompts,
        max_tokens=req.max_tokens or defaults.max_tokens,
        ready_timeout_s=req.ready_timeout_s or defaults.ready_timeout_s,
        target_dir=target_dir,
        drafter_dir=drafter_dir,
        max_batch_size=max_batch_size,
        max_seq_len=max_seq_len,
        build_max_batch_size=max_batch_size if engine == "torch" else req.max_batch_size,
        build_max_seq_len=max_seq_len if engine == "torch" else req.max_seq_len,
        threads=threads,
        gpu_sets=sets if engine == "trtllm" else None,
    )
