"""One ``spectool tune`` run: pick prompts, measure cells on real servers, decide, write outputs.

Order of work:

1. prompts (:mod:`~spectool.tuning.prompts`) and the setup; the output folder is checked
   against ``--resume``/``--force`` (:func:`~spectool.tuning.setup.prepare_out_dir`);
2. cells already measured in ``DIR/trials.jsonl`` (every repeat saved) are loaded and handed to
   the search as finished: they are never measured again;
3. :func:`spectool.decide.tune.tune` searches: it asks for a cell and this module measures it
   through :func:`spectool.measure.runner.measure` (each trial appended to ``trials.jsonl`` the
   moment it ends). Baselines are one trial (or ``--repeats``). A speculative cell, on a server
   that switches its draft length in place (the embedded engine), is measured in interleaved
   pairs of speculative and baseline blocks until its paired interval is settled
   (:mod:`~spectool.tuning.pairing`): every ratio compares measurements of the same minute. On
   trtllm-serve (a restart per draft length) the baselines are measured again after the
   speculative cells and bracket them (``measure_after``);
4. outputs: ``decision.json`` and the build files (:mod:`~spectool.tuning.deploy`),
   ``tune.json`` (:mod:`~spectool.tuning.record`), ``report.md`` (:mod:`~spectool.tuning.report`)
   and the PNG figures (:mod:`~spectool.tuning.plots`).

A request that fails (HTTP error, broken stream) makes its cell unusable: the run stops with
:class:`~spectool.errors.ChildProcessError_` naming the cell and the first error, rather than
deciding from the requests that happened to succeed; ``--resume`` measures such trials again
(:func:`drop_failed_trials`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from spectool.decide.cell import CellMeasurement, pooled
from spectool.decide.model import ScheduleSemantics
from spectool.decide.paired import PairedCell
from spectool.decide.stats import CellStats, cell_stats, stall_notes
from spectool.decide.tune import TuneResult, tune
from spectool.errors import ChildProcessError_, SpectoolError
from spectool.io import atomic_write_text
from spectool.measure.client import StreamResult
from spectool.measure.runner import Progress, TrialConfig, TrialResult, load_trials
from spectool.tuning.driver import ServerDriver, ServerInfo
from spectool.tuning.pairing import LOOKS, NotSaved, drift_notes, measure_paired
from spectool.tuning.prompts import TunePrompts, tune_prompts
from spectool.tuning.request import ResolvedTune
from spectool.tuning.setup import (
    SERVER_LOG_NAME,
    TRIALS_NAME,
    TuneSetup,
    checkpoint_identity,
    prepare_out_dir,
)
from spectool.tuning.trials import CellPlan, pooled_cell

CellKey = tuple[int, int]
# /metrics polling period: the engines keep 1000 iterations between reads, far more than a
# quarter second holds; a short period shortens the wait after each trial.
METRICS_INTERVAL_S = 0.25


class TuneProgress(Progress, Protocol):
    """The runner's trial hooks plus tune's own: cells, servers, messages."""

    def on_cell_start(self, concurrency: int, k: int, number: int) -> None:
        """Cell ``number`` (1-based, this run) is about to be measured."""

    def on_server_ready(self, info: ServerInfo) -> None:
        """A server for ``info.k`` is up (``ready_s`` 0: it was already running)."""

    def on_message(self, text: str) -> None:
        """A line worth showing (what is reused, what is written)."""


@dataclass(frozen=True)
class TuneOutcome:
    """A finished run: the decision, every cell used, and what was written where."""

    result: TuneResult
    resolved: ResolvedTune
    out: Path
    setup: TuneSetup
    prompts: TunePrompts
    cells: dict[CellKey, CellMeasurement]
    stats: dict[CellKey, CellStats]
    trials_measured_now: int
    server_starts: int
    wall_s: float
    measure_s: float
    files: tuple[Path, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)


def count_tokens_for(resolved: ResolvedTune) -> Callable[[str], int] | None:
    """The target tokenizer's counter when its folder has ``tokenizer.json``."""
    from spectool.measure.client import tokenizer_counter

    folder = Path(resolved.report.target.path)
    return tokenizer_counter(folder) if (folder / "tokenizer.json").is_file() else None


def _server_settings(resolved: ResolvedTune) -> dict[str, object]:
    req = resolved.request
    common: dict[str, object] = {
        "max_batch_size": resolved.max_batch_size,
        "max_seq_len": resolved.max_seq_len,
    }
    if resolved.engine == "torch":
        return {**common, "device": req.device, "dtype": req.dtype, "threads": resolved.threads}
    trtllm = resolved.report.trtllm or {}
    return {
        **common,
        "release": trtllm.get("release"),
        "version": trtllm.get("version"),
        "backend": req.trtllm_backend,
        "gpu": (resolved.report.gpu or {}).get("name"),
        "tp": req.tp,
    }


def prompts_for(resolved: ResolvedTune, count_tokens: Callable[[str], int] | None) -> TunePrompts:
    """The run's prompts: enough for the largest trial, each fitting the sequence limit with
    the output and one verify step's drafts."""
    probe = CellPlan(
        resolved.engine, resolved.method, "-", "-", resolved.num_prompts, resolved.max_tokens
    )
    return tune_prompts(
        resolved.request.workload,
        max(probe.requests_at(c) for c in resolved.concurrencies),
        count_tokens=count_tokens,
        max_prompt_tokens=resolved.max_seq_len - resolved.max_tokens - resolved.max_draft_len - 1,
        seed=resolved.request.seed,
    )


def cell_plan(resolved: ResolvedTune, setup: TuneSetup, prompts: TunePrompts) -> CellPlan:
    """How every cell of the run is measured (the trials' configs)."""
    return CellPlan(
        engine=resolved.engine,
        method=resolved.method,
        fingerprint=setup.fingerprint(),
        workload_id=prompts.workload_id,
        num_prompts=resolved.num_prompts,
        max_tokens=resolved.max_tokens,
        repeats=resolved.request.repeats,
    )


def make_setup(resolved: ResolvedTune, prompts: TunePrompts) -> TuneSetup:
    """The setup of this run (what its trials measure; see :mod:`spectool.tuning.setup`)."""
    report = resolved.report
    drafter = report.drafter
    return TuneSetup(
        engine=resolved.engine,
        method=resolved.method,
        target=checkpoint_identity(report.target.ref, Path(report.target.path)),
        drafter=(
            checkpoint_identity(drafter.ref, Path(drafter.path)) if drafter is not None else None
        ),
        server=_server_settings(resolved),
        workload={"source": prompts.source, "id": prompts.workload_id},
        max_tokens=resolved.max_tokens,
        num_prompts=resolved.num_prompts,
        repeats=resolved.request.repeats,
    )


def measurement_plan(
    resolved: ResolvedTune,
) -> tuple[Callable[[str], int] | None, TunePrompts, TuneSetup, CellPlan]:
    """What every measurement of a run shares: the token counter, the prompts, the setup
    (its fingerprint labels the trials) and the trial plan (tune and its benchmarks alike)."""
    count_tokens = count_tokens_for(resolved)
    prompts = prompts_for(resolved, count_tokens)
    setup = make_setup(resolved, prompts)
    return count_tokens, prompts, setup, cell_plan(resolved, setup, prompts)


def make_driver(resolved: ResolvedTune, out: Path) -> ServerDriver:
    """The server driver for the resolved engine."""
    if resolved.engine == "torch":
        from spectool.tuning.torch_driver import TorchDriver

        assert resolved.target_dir is not None
        assert resolved.threads is not None
        return TorchDriver(
            resolved.target_dir,
            resolved.drafter_dir,
            resolved.method,
            model_name=resolved.target_dir.name,
            max_batch_size=resolved.max_batch_size,
            max_seq_len=resolved.max_seq_len,
            device=resolved.request.device,
            dtype=resolved.request.dtype,
            threads=resolved.threads,
            log_path=out / SERVER_LOG_NAME,
            ready_timeout_s=resolved.ready_timeout_s,
            max_draft_len=resolved.max_draft_len,
        )
    from spectool.tuning.trtllm_driver import TrtllmDriver

    return TrtllmDriver(resolved, configs_dir=out / "configs", log_dir=out / "logs")


def schedule_semantics(resolved: ResolvedTune) -> ScheduleSemantics:
    """How the engine reads ``draft_len_schedule`` keys (informational in decision.json)."""
    if resolved.engine == "trtllm" and resolved.report.trtllm is not None:
        from spectool.trtllm.releases import release_info

        rule = release_info(resolved.report.trtllm["release"]).schedule_rule
        return "up_to" if rule == "smallest_key" else "from"
    return "up_to"


def _check_requests(results: Sequence[TrialResult], where: str) -> None:
    for trial in results:
        failed = trial.errors
        if failed:
            raise ChildProcessError_(
                f"{where}: {len(failed)} of {len(trial.records)} requests failed in trial "
                f"{trial.config.label!r} (first: {failed[0].error}); a cell is measured on "
                "complete requests only. Fix the server (see its log), then rerun with --resume "
                "(failed trials are measured again)"
            )


def drop_failed_trials(path: Path, saved: Mapping[str, TrialResult]) -> int:
    """Rewrite ``path`` without the trials that had a failed request; returns how many.

    A failed trial is never used (:func:`_check_requests`); dropping it lets ``--resume``
    measure it again instead of refusing the whole folder.
    """
    import json

    failed = {key for key, trial in saved.items() if trial.errors}
    if not failed:
        return 0
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        try:
            key = json.loads(line).get("key")
        except (json.JSONDecodeError, AttributeError):
            key = None
        if key not in failed:
            kept.append(line)
    atomic_write_text(path, "".join(kept))
    return len(failed)


def finished_cells(
    saved: Mapping[str, TrialResult], plan: CellPlan, grid: Sequence[CellKey]
) -> dict[CellKey, CellMeasurement]:
    """Cells of ``grid`` whose every repeat is in ``saved`` (a resumed run reuses them)."""
    cells: dict[CellKey, CellMeasurement] = {}
    for c, k in grid:
        keys = [config.key() for config in plan.configs(c, k)]
        if all(key in saved for key in keys):
            results = [saved[key] for key in keys]
            _check_requests(results, f"saved cell (concurrency={c}, k={k})")
            cells[(c, k)] = pooled_cell(results, k)
    return cells


def paired_options(resolved: ResolvedTune) -> dict[str, object]:
    """The stopping rule's settings (the same for a resumed run)."""
    req = resolved.request
    return {
        "threshold": 1.0 - req.min_gain,
        "confidence": req.confidence,
        "seed": req.seed,
        "budget_s": req.budget_s,
    }


def finished_pairs(
    saved: Mapping[str, TrialResult],
    plan: CellPlan,
    grid: Sequence[CellKey],
    options: Mapping[str, object],
) -> dict[CellKey, PairedCell]:
    """Paired cells of ``grid`` whose every block is in ``saved`` (up to where they stopped)."""
    out: dict[CellKey, PairedCell] = {}
    for c, k in grid:
        if k == 0:
            continue

        def lookup(pair: int, arm: int, c: int = c, k: int = k) -> TrialResult:
            trial = saved.get(plan.block_config(c, k, pair, arm).key())
            if trial is None:
                raise NotSaved
            _check_requests([trial], f"saved block (concurrency={c}, k={k})")
            return trial

        try:
            out[(c, k)] = measure_paired(c, k, lookup, **options)  # type: ignore[arg-type]
        except NotSaved:
            continue
    return out


class _CountingHooks:
    """Forwards the runner's hooks to ``progress``, counts the trials finished now, and stops
    the run (KeyboardInterrupt) once ``should_stop`` says so."""

    def __init__(
        self, progress: TuneProgress | None, should_stop: Callable[[], bool] | None
    ) -> None:
        self.progress = progress
        self.should_stop = should_stop
        self.trials_done = 0

    def check(self) -> None:
        if self.should_stop is not None and self.should_stop():
            raise KeyboardInterrupt

    def on_trial_start(self, config: TrialConfig, num_requests: int) -> None:
        self.check()
        if self.progress is not None:
            self.progress.on_trial_start(config, num_requests)

    def on_request_done(self, config: TrialConfig, result: StreamResult) -> None:
        if self.progress is not None:
            self.progress.on_request_done(config, result)
        self.check()

    def on_trial_done(self, result: TrialResult) -> None:
        self.trials_done += 1  # already saved: counted even if the run stops now
        if self.progress is not None:
            self.progress.on_trial_done(result)
        self.check()


def run_tune(
    resolved: ResolvedTune,
    *,
    progress: TuneProgress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TuneOutcome:
    """Measure, decide and write every output; see the module docstring.

    ``should_stop`` is polled between requests, trials and cells; when it returns True the run
    stops with KeyboardInterrupt (servers stopped, finished trials kept for ``--resume``).
    """
    from spectool.measure.runner import measure

    started = time.perf_counter()
    req = resolved.request
    if resolved.engine == "trtllm":  # before anything is written: the install hint, exit 2
        from spectool.trtllm.launch import find_trtllm_serve

        find_trtllm_serve()
    out = Path(req.out).expanduser().resolve()
    count_tokens, prompts, setup, plan = measurement_plan(resolved)
    prepare_out_dir(out, setup, resume=req.resume, force=req.force)
    trials_path = out / TRIALS_NAME
    concs = resolved.concurrencies
    grid = [(c, k) for c in concs for k in range(resolved.max_draft_len + 1)]
    saved = load_trials(trials_path)
    failed = drop_failed_trials(trials_path, saved)
    if failed and progress is not None:
        progress.on_message(f"resuming: {failed} saved trials had failed requests; measuring again")
    saved = load_trials(trials_path) if failed else saved
    finished = finished_cells(saved, plan, grid)
    options = paired_options(resolved)
    pairs_done = finished_pairs(saved, plan, grid, options)
    if (finished or pairs_done) and progress is not None:
        progress.on_message(
            f"resuming: {len(finished) + len(pairs_done)} cells already measured in {trials_path}"
        )
    cells: dict[CellKey, CellMeasurement] = dict(finished)
    base_blocks: dict[int, list[CellMeasurement]] = {}  # baseline blocks of paired cells

    def keep_pairs(key: CellKey, cell: PairedCell) -> PairedCell:
        cells[key] = cell.spec
        base_blocks.setdefault(key[0], []).append(cell.base)
        return cell

    for key, paired_cell in pairs_done.items():
        keep_pairs(key, paired_cell)
    cells_started = 0
    hooks = _CountingHooks(progress, should_stop)
    driver = make_driver(resolved, out)
    measure_started = time.perf_counter()
    with driver:

        def run_trials(configs: list[TrialConfig], k: int, where: str) -> list[TrialResult]:
            info = driver.serve(k)
            if progress is not None and info.ready_s > 0:
                progress.on_server_ready(info)
            results = measure(
                info.base_url,
                info.model_name,
                prompts.prompts,
                configs,
                results_path=trials_path,
                progress=hooks,
                count_tokens=count_tokens,
                metrics_interval_s=METRICS_INTERVAL_S,
                metrics_path=info.metrics_path,
            )
            _check_requests(results, where)
            return results

        def measure_cell(c: int, k: int) -> CellMeasurement | PairedCell:
            nonlocal cells_started
            hooks.check()
            cells_started += 1
            if progress is not None:
                progress.on_cell_start(c, k, cells_started)
            where = f"cell (concurrency={c}, k={k})"
            if k > 0 and driver.interleaves:

                def block(pair: int, arm: int) -> TrialResult:
                    config = plan.block_config(c, k, pair, arm)
                    trial = saved.get(config.key())
                    return trial if trial is not None else run_trials([config], arm, where)[0]

                return keep_pairs((c, k), measure_paired(c, k, block, **options))  # type: ignore[arg-type]
            cell = pooled_cell(run_trials(plan.configs(c, k), k, where), k)
            cells[(c, k)] = cell
            return cell

        def measure_after(c: int) -> CellMeasurement:
            config = plan.after_config(c)
            trial = saved.get(config.key())
            if trial is None:
                trial = run_trials([config], 0, f"baseline again (concurrency={c})")[0]
            return pooled_cell([trial], 0)

        result = tune(
            concs,
            resolved.max_draft_len,
            measure_cell,
            finished=finished,
            finished_pairs=pairs_done,
            engine=resolved.engine,
            method=resolved.method,
            n_boot=req.n_boot,
            confidence=req.confidence,
            seed=req.seed,
            min_gain=req.min_gain,
            semantics=schedule_semantics(resolved),
            looks=LOOKS,
            measure_after=None if driver.interleaves else measure_after,
        )
        server_starts = driver.starts
    measure_s = time.perf_counter() - measure_started
    used = {(v.concurrency, v.k) for v in result.cells} | {(c, 0) for c in concs}
    cells = {key: cell for key, cell in cells.items() if key in used}
    for c, blocks in base_blocks.items():  # a concurrency's baseline: every baseline block
        cells[(c, 0)] = pooled([cells[(c, 0)], *blocks]) if (c, 0) in cells else pooled(blocks)
    stats = {
        key: cell_stats(cell, n_boot=req.n_boot, confidence=req.confidence, seed=req.seed)
        for key, cell in sorted(cells.items())
    }
    return _write_outputs(
        resolved,
        result,
        out=out,
        setup=setup,
        prompts=prompts,
        cells=cells,
        stats=stats,
        trials_measured_now=hooks.trials_done,
        server_starts=server_starts,
        started=started,
        measure_s=measure_s,
        progress=progress,
    )


def _write_outputs(
    resolved: ResolvedTune,
    result: TuneResult,
    *,
    out: Path,
    setup: TuneSetup,
    prompts: TunePrompts,
    cells: dict[CellKey, CellMeasurement],
    stats: dict[CellKey, CellStats],
    trials_measured_now: int,
    server_starts: int,
    started: float,
    measure_s: float,
    progress: TuneProgress | None,
) -> TuneOutcome:
    """decision.json and the build files, then tune.json, report.md and the figures.

    A build that fails (e.g. a release that cannot express the schedule) still leaves the
    measurements, tune.json and report.md written; its error is raised last.
    """
    from spectool.tuning import plots, record, report
    from spectool.tuning.deploy import write_decision, write_deployment

    files: list[Path] = []
    notes: list[str] = list(result.notes)
    if prompts.dropped:
        notes.append(
            f"{prompts.dropped} prompts longer than {prompts.max_prompt_tokens} tokens were left "
            "out (they would not fit the server's sequence limit with the output)"
        )
    notes += stall_notes(result.choices, result.cells, stats)
    notes += drift_notes(result.cells, result.choices)
    build_error: SpectoolError | None = None
    try:
        deployment = write_deployment(resolved, result, out)
        files += [deployment.decision_path, *deployment.build_files]
        notes += [f"build: {n}" for n in deployment.notes]
    except SpectoolError as exc:
        build_error = exc
        files.append(write_decision(result, out))
        notes.append(f"build files not written: {exc}")
    outcome = TuneOutcome(
        result=result,
        resolved=resolved,
        out=out,
        setup=setup,
        prompts=prompts,
        cells=cells,
        stats=stats,
        trials_measured_now=trials_measured_now,
        server_starts=server_starts,
        wall_s=0.0,
        measure_s=measure_s,
        files=(),
        notes=tuple(notes),
    )
    try:
        files += plots.write_plots(outcome)
    except ImportError as exc:  # matplotlib is an optional extra
        notes.append(
            f"figures not drawn: {exc.name or 'matplotlib'} is not installed (pip install 'spectool[plots]')"
        )
        outcome = _replace(outcome, notes=tuple(notes))
    files = list(dict.fromkeys(files))
    outcome = _replace(outcome, wall_s=time.perf_counter() - started, files=tuple(files))
    files.append(record.write_tune_json(outcome))
    files.append(report.write_report(outcome))
    files = list(dict.fromkeys(files))  # decision.json is also one of the build's files
    outcome = _replace(outcome, wall_s=time.perf_counter() - started, files=tuple(files))
    if progress is not None:
        for path in files:
            progress.on_message(f"wrote {path}")
    if build_error is not None:
        raise build_error
    return outcome


def _replace(outcome: TuneOutcome, **changes: object) -> TuneOutcome:
    import dataclasses

    return dataclasses.replace(outcome, **changes)  # type: ignore[arg-type]
