"""One ``spectool tune`` run: pick prompts, measure cells on real servers, decide, write outputs.

Order of work:

1. prompts (:mod:`~spectool.tuning.prompts`) and the setup (:mod:`~spectool.tuning.plan`); the
   output folder is checked against ``--resume``/``--force``
   (:func:`~spectool.tuning.setup.prepare_out_dir`);
2. cells already measured in ``DIR/trials.jsonl`` (every repeat saved) are loaded and handed to
   the search as finished: they are never measured again (:mod:`~spectool.tuning.resume`);
3. :func:`spectool.decide.tune.tune` searches: it asks for a cell and this module measures it
   through :func:`spectool.measure.runner.measure` (each trial appended to ``trials.jsonl`` the
   moment it ends). Baselines are one trial (or ``--repeats``). A speculative cell, on a server
   that switches its draft length in place (the embedded engine), is measured in interleaved
   pairs of speculative and baseline blocks until its paired interval is settled
   (:mod:`~spectool.tuning.pairing`): every ratio compares measurements of the same minute. On
   trtllm-serve (a restart per draft length) with one GPU set the baselines are measured again
   after the speculative cells and bracket them (``measure_after``); with two GPU sets or more
   (``--gpus``) the baseline server stays up beside the speculative one and each pair's blocks
   are measured at the same moment (``concurrent``, :mod:`~spectool.tuning.side_by_side`);
4. outputs (:mod:`~spectool.tuning.outputs`): ``decision.json`` and the build files
   (:mod:`~spectool.tuning.deploy`), ``tune.json`` (:mod:`~spectool.tuning.record`), ``report.md`` (:mod:`~spectool.tuning.report`)
   and the PNG figures (:mod:`~spectool.tuning.plots`).

A request that fails (HTTP error, broken stream) makes its cell unusable: the run stops with
:class:`~spectool.errors.ChildProcessError_` naming the cell and the first error, rather than
deciding from the requests that happened to succeed; ``--resume`` measures such trials again
(:func:`~spectool.tuning.resume.drop_failed_trials`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Protocol

from spectool.decide.cell import CellMeasurement, pooled
from spectool.decide.paired import PairedCell
from spectool.decide.search import initial_plan
from spectool.decide.stats import cell_stats
from spectool.decide.tune import tune
from spectool.measure.client import StreamResult
from spectool.measure.runner import Progress, TrialConfig, TrialResult, load_trials
from spectool.tuning.driver import ServerDriver, ServerInfo
from spectool.tuning.outcome import CellKey, TuneOutcome
from spectool.tuning.outputs import write_outputs
from spectool.tuning.pairing import LOOKS, measure_paired
from spectool.tuning.plan import (
    METRICS_INTERVAL_S,
    make_driver,
    measurement_plan,
    schedule_semantics,
)
from spectool.tuning.prior import PriorStep
from spectool.tuning.prompts import TunePrompts
from spectool.tuning.request import ResolvedTune
from spectool.tuning.resume import (
    check_requests,
    drop_failed_trials,
    finished_cells,
    finished_pairs,
    paired_options,
)
from spectool.tuning.setup import TRIALS_NAME, prepare_out_dir
from spectool.tuning.side_by_side import measure_at_once, pair_blocks
from spectool.tuning.trials import pooled_cell


class TuneProgress(Progress, Protocol):
    """The runner's trial hooks plus tune's own: cells, servers, messages."""

    def on_cell_start(self, concurrency: int, k: int, number: int) -> None:
        """Cell ``number`` (1-based, this run) is about to be measured."""

    def on_server_ready(self, info: ServerInfo) -> None:
        """A server for ``info.k`` is up (``ready_s`` 0: it was already running)."""

    def on_message(self, text: str) -> None:
        """A line worth showing (what is reused, what is written)."""


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
    rival: Mapping[int, float] | None = None,
    baselines: Mapping[CellKey, CellMeasurement] | None = None,
    driver: ServerDriver | None = None,
    dry: bool = False,
    use_prior: bool = False,
    quiet_resume: bool = False,
    stops: Mapping[CellKey, int] | None = None,
) -> TuneOutcome:
    """Measure, decide and write every output; see the module docstring.

    ``rival``: per concurrency, the ratio another method chose there, when tune compares
    methods (:mod:`spectool.tuning.compare`); cells predicted to lose to it are not confirmed.
    ``baselines``: the ``k = 0`` cells an earlier method measured for the same target, engine
    and settings, used as finished cells (this run's paired cells still carry their own
    baseline blocks).

    ``should_stop`` is polled between requests, trials and cells; when it returns True the run
    stops with KeyboardInterrupt (servers stopped, finished trials kept for ``--resume``).

    Methods compared on one server (:mod:`spectool.tuning.joint`): ``driver`` is the shared
    server's view for this method (not closed here); ``dry`` measures baselines but no paired
    cell: the first paired cell the search wants and ``trials.jsonl`` lacks raises
    :class:`~spectool.tuning.joint.Wanted`, and a search that needs nothing more raises
    :class:`~spectool.tuning.joint.Ready` with its result (nothing written).
    ``use_prior``: the roofline prior stands in for the ``k = 1`` cost cell, as for a method
    compared with a rival (every method after the first). ``quiet_resume``: say nothing of
    the cells found in ``trials.jsonl`` (a comparison's searches run over them again and again).
    ``stops``: this method's cells that a joint cell ended early (the arm was out-raced), with
    their pairs (:func:`spectool.tuning.joint.out_raced`).
    """
    from spectool.measure.runner import measure
    from spectool.tuning.joint import Ready, Wanted

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
    concurrent = resolved.gpu_sets is not None and resolved.gpu_sets.concurrent
    design = "concurrent" if concurrent else "interleaved"
    pairs_done = finished_pairs(saved, plan, grid, options, stops, design=design)
    if (finished or pairs_done) and progress is not None and not (dry or quiet_resume):
        progress.on_message(
            f"resuming: {len(finished) + len(pairs_done)} cells already measured in {trials_path}"
        )
    shared = {
        key: cell
        for key, cell in (baselines or {}).items()
        if key[1] == 0 and key in grid and key not in finished
    }
    if shared and progress is not None and not dry:
        progress.on_message(f"using the first method's {len(shared)} baseline cells")
    finished = {**shared, **finished}
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
    own_driver = driver is None
    if driver is None:
        driver = make_driver(resolved, out)
    # a prior where a planned cell is dear: a server start per k, or a method compared with a
    # rival (spectool.tuning.prior)
    prior_step = None
    if not driver.interleaves or rival or use_prior:
        prior_step = _prior(resolved, prompts, out, None if dry else progress)
    # the draft lengths the search plans first (spectool.decide.search.initial_plan), in order:
    # with two GPU sets or more their servers start while the baselines are measured
    planned = initial_plan(concs, resolved.max_draft_len, prior=prior_step is not None)
    first_ks = [k for _, k in planned if k > 0]
    prefetched: list[bool] = []  # once, at the first baseline
    measure_started = time.perf_counter()
    with driver if own_driver else nullcontext(driver):

        def run_trials(configs: list[TrialConfig], k: int, where: str) -> list[TrialResult]:
            if concurrent:  # the search's first draft lengths load while the baselines run
                if not prefetched:
                    driver.prefetch(first_ks)  # type: ignore[attr-defined]
                    prefetched.append(True)
                info = driver.serve_baseline()  # type: ignore[attr-defined]
            else:
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
                finished=saved,
            )
            saved.update((r.config.key(), r) for r in results)
            check_requests(results, where)
            return results

        def measure_cell(c: int, k: int) -> CellMeasurement | PairedCell:
            nonlocal cells_started
            hooks.check()
            if dry and k > 0 and driver.interleaves:
                raise Wanted(c, k)  # resume picked up every saved paired cell already
            cells_started += 1
            if progress is not None:
                progress.on_cell_start(c, k, cells_started)
            where = f"cell (concurrency={c}, k={k})"
            if k > 0 and concurrent:
                paired_cell = measure_paired(
                    c,
                    k,
                    pair_blocks(
                        lambda spec, base: measure_pair(k, spec, base, where),
                        lambda pair, arm: plan.block_config(c, k, pair, arm),
                        saved,
                        k,
                    ),
                    **plan.pass_options(c),  # type: ignore[arg-type]
                    **options,  # type: ignore[arg-type]
                    design="concurrent",
                )
                return keep_pairs((c, k), paired_cell)
            if k > 0 and driver.interleaves:

                def block(pair: int, arm: int) -> TrialResult:
                    config = plan.block_config(c, k, pair, arm)
                    trial = saved.get(config.key())
                    return trial if trial is not None else run_trials([config], arm, where)[0]

                paired_cell = measure_paired(
                    c,
                    k,
                    block,
                    **plan.pass_options(c),  # type: ignore[arg-type]
                    **options,  # type: ignore[arg-type]
                    stop_after=(stops or {}).get((c, k)),
                )
                return keep_pairs((c, k), paired_cell)
            cell = pooled_cell(run_trials(plan.configs(c, k), k, where), k)
            cells[(c, k)] = cell
            return cell

        def measure_pair(
            k: int, spec: TrialConfig, base: TrialConfig, where: str
        ) -> tuple[TrialResult, TrialResult]:
            """Both blocks of a concurrent pair, started together on their two servers."""
            base_info, spec_info = driver.serve_pair(k)  # type: ignore[attr-defined]
            for info in (base_info, spec_info):
                if progress is not None and info.ready_s > 0:
                    progress.on_server_ready(info)
            spec_trials, base_trials = measure_at_once(
                [(spec_info, [spec]), (base_info, [base])],
                prompts.prompts,
                results_path=trials_path,
                progress=hooks,
                count_tokens=count_tokens,
                metrics_interval_s=METRICS_INTERVAL_S,
                finished=saved,
            )
            for trial in (*spec_trials, *base_trials):
                saved[trial.config.key()] = trial
            check_requests([*spec_trials, *base_trials], where)
            return spec_trials[0], base_trials[0]

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
            measure_after=None if driver.interleaves or concurrent else measure_after,
            rival=rival,
            prior_step=prior_step,
            objective=req.objective,
            switches_in_place=driver.interleaves,
        )
        server_starts = driver.starts
    servers = _servers_ledger(driver, concurrent)
    if dry:
        raise Ready(result)
    measure_s = time.perf_counter() - measure_started
    used = {(v.concurrency, v.k) for v in result.cells} | {(c, 0) for c in concs}
    cells = {key: cell for key, cell in cells.items() if key in used}
    for c, blocks in base_blocks.items():  # a concurrency's baseline: every baseline block
        cells[(c, 0)] = pooled([cells[(c, 0)], *blocks]) if (c, 0) in cells else pooled(blocks)
    stats = {
        key: cell_stats(cell, n_boot=req.n_boot, confidence=req.confidence, seed=req.seed)
        for key, cell in sorted(cells.items())
    }
    return write_outputs(
        resolved,
        result,
        out=out,
        setup=setup,
        prompts=prompts,
        cells=cells,
        stats=stats,
        trials_measured_now=hooks.trials_done,
        server_starts=server_starts,
        servers=servers,
        started=started,
        measure_s=measure_s,
        progress=progress,
    )


def _servers_ledger(driver: ServerDriver, concurrent: bool) -> dict[str, object] | None:
    """The design, the GPU sets and the servers' wall time (a TensorRT-LLM driver; None else)."""
    sets = getattr(driver, "sets", None)
    if sets is None:
        return None
    from spectool.tuning.side_by_side import ledger

    return {
        "design": "concurrent" if concurrent else "bracketed",
        **sets.to_json(),
        **ledger(driver.servers, driver.demand, driver.wait_s, concurrent=concurrent),  # type: ignore[attr-defined]
    }


def _prior(
    resolved: ResolvedTune, prompts: TunePrompts, out: Path, progress: TuneProgress | None
) -> PriorStep | None:
    """The roofline prior for a server that restarts per draft length (one message either way)."""
    from spectool.tuning.prior import roofline_prior

    # context per sequence while decoding: the longest prompt kept (the mean is not counted) plus
    # half the output; the prior's k=1/k=K ratio barely moves with it
    prompt = prompts.max_prompt_tokens or resolved.max_seq_len // 2
    prior, why = roofline_prior(resolved, context=prompt + resolved.max_tokens // 2, out=out)
    if progress is not None:
        progress.on_message(why)
    return prior
