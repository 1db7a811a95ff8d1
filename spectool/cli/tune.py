"""``spectool tune``: measure baseline and speculation per concurrency, choose k, write the configs.

The command checks its options, hands a :class:`~spectool.tuning.request.TuneRequest` to
:func:`spectool.tuning.session.run_tune` and renders the outcome. Progress is drawn with rich on
stderr when it is a terminal and kept quiet otherwise. SIGTERM is turned into the same clean stop
as Ctrl-C (servers stopped, finished trials kept; rerun with ``--resume``). Exit codes: 0
decided, 1 the check found errors, 2 bad input (including an output folder with results and
neither ``--resume`` nor ``--force``), 3 a server failed, 130 interrupted.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import typer

from spectool.cli.help import command_class
from spectool.cli.options import (
    AcceptanceLengthOpt,
    AcceptanceRateOpt,
    AttentionDpOpt,
    DrafterArg,
    EpOpt,
    GpusPerNodeOpt,
    JsonOpt,
    MaxDraftLenOpt,
    MaxSeqOpt,
    MethodOpt,
    NodesOpt,
    PpOpt,
    ProfileOpt,
    TargetArg,
    TpOpt,
    TrtllmBackendOpt,
    TrtllmVersionOpt,
    TrustRemoteCodeOpt,
)
from spectool.cli.tune_options import (
    AcceptanceFromOpt,
    BudgetOpt,
    BurstinessOpt,
    CapacityOpt,
    ConcurrencyOpt,
    ConfidenceOpt,
    DeviceOpt,
    DtypeOpt,
    ForceOpt,
    GpusOpt,
    LauncherOpt,
    MaxTokensOpt,
    MinGainOpt,
    NumPromptsOpt,
    ObjectiveOpt,
    PredictOnlyOpt,
    ReadyTimeoutOpt,
    RepeatsOpt,
    RequestRateOpt,
    ResumeOpt,
    SeedOpt,
    SloOpt,
    TemperatureOpt,
    ThreadsOpt,
    TimeScaleOpt,
    TopPOpt,
    TuneEngineOpt,
    TuneGpuOpt,
    TuneMaxBatchOpt,
    TuneOutOpt,
    WorkloadOpt,
    help_defaults,
)
from spectool.decide.verdict import DEFAULT_OBJECTIVE

if TYPE_CHECKING:
    from spectool.measure.client import StreamResult
    from spectool.measure.runner import TrialConfig, TrialResult
    from spectool.tuning.capacity import Search
    from spectool.tuning.compare import MethodsOutcome
    from spectool.tuning.driver import ServerInfo
    from spectool.tuning.outcome import TuneOutcome
    from spectool.tuning.rates import RateCell
    from spectool.tuning.request import TuneRequest
    from spectool.tuning.session import TuneProgress


PLAIN_EVERY_S = 10.0


class RichTuneProgress:
    """Rich progress on stderr: one line per cell and server, a bar per trial's requests."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        from spectool.cli.output import err_console

        self.console = err_console
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        )
        self._tasks: dict[str, Any] = {}  # per trial label: two run at once with --gpus

    def __enter__(self) -> RichTuneProgress:
        self.progress.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.progress.stop()

    def on_message(self, text: str) -> None:
        self.progress.console.print(text, markup=False, highlight=False)

    def on_cell_start(self, concurrency: int, k: int, number: int) -> None:
        what = "baseline (no speculation)" if k == 0 else f"draft length {k}"
        self.progress.console.print(f"cell {number}: concurrency {concurrency}, {what}")

    def on_server_ready(self, info: ServerInfo) -> None:
        if info.ready_s > 0:
            self.progress.console.print(
                f"  server k={info.k} ready in {info.ready_s:.1f} s", style="dim"
            )

    def on_trial_start(self, config: TrialConfig, num_requests: int) -> None:
        label = config.label.split(" setup=")[0]
        task = self.progress.add_task(f"  c={config.concurrency} {label}", total=num_requests)
        self._tasks[config.label] = task

    def on_request_done(self, config: TrialConfig, result: StreamResult) -> None:
        if config.label in self._tasks:
            self.progress.advance(self._tasks[config.label])

    def on_trial_done(self, result: TrialResult) -> None:
        task = self._tasks.pop(result.config.label, None)
        if task is not None:
            self.progress.remove_task(task)
        if "#p" in result.config.label:  # a block of a paired cell: the bar was enough
            return
        tokens = sum(r.output_tokens for r in result.records)
        self.progress.console.print(
            f"  {len(result.records)} requests, {tokens} tokens in {result.wall_time_s:.1f} s",
            style="dim",
        )


class PlainTuneProgress:
    """Progress as plain lines on stderr when it is not a terminal (a log, CI): a line per
    cell and server, and one at most every :data:`PLAIN_EVERY_S` seconds while measuring."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()
        self.last = self.started
        self.trials = 0

    def _line(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:5.0f} s] {text}", file=self.stream, flush=True)
        self.last = time.monotonic()

    def on_message(self, text: str) -> None:
        self._line(text)

    def on_cell_start(self, concurrency: int, k: int, number: int) -> None:
        what = "baseline (no speculation)" if k == 0 else f"draft length {k}, paired blocks"
        self._line(f"cell {number}: concurrency {concurrency}, {what}")

    def on_server_ready(self, info: ServerInfo) -> None:
        self._line(f"server ready in {info.ready_s:.1f} s")

    def on_trial_start(self, config: TrialConfig, num_requests: int) -> None:
        pass

    def on_request_done(self, config: TrialConfig, result: StreamResult) -> None:
        pass

    def on_trial_done(self, result: TrialResult) -> None:
        self.trials += 1
        if time.monotonic() - self.last >= PLAIN_EVERY_S:
            self._line(f"  {self.trials} trials measured so far")


class _StopRequest:
    """Set by SIGTERM; checked between requests, trials and cells (see :func:`_sigterm_as_interrupt`)."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self) -> bool:
        return self.requested


@contextmanager
def _sigterm_as_interrupt(stop: _StopRequest) -> Iterator[None]:
    """While active, SIGTERM stops the run like Ctrl-C: KeyboardInterrupt at once and, should
    Python swallow that one (it is raised wherever the main thread is, possibly inside a
    finalizer), again at the next check of ``stop`` between requests, trials and cells."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    import asyncio  # the load generator's; imported here, never inside the handler

    def handler(_signum: int, _frame: FrameType | None) -> None:
        stop.requested = True
        if callable(signal.getsignal(signal.SIGINT)):
            # As Ctrl-C: inside asyncio.run (the load generator) asyncio's own SIGINT handler
            # cancels the running task cleanly and then raises KeyboardInterrupt; raised here
            # instead, it can land inside the event loop's internals and leave a task that
            # never runs again, so the loop's shutdown waits forever (a SIGTERMed tune hung 20+
            # minutes). Outside a loop, SIGINT's default handler raises it at once.
            signal.raise_signal(signal.SIGINT)
            return
        # SIGINT ignored (started in the background by a shell without job control, as
        # ``nohup spectool tune ... &`` in a script): asyncio then installs no SIGINT handler,
        # so do what it would do, cancel the loop's tasks and wake it; the CancelledError
        # that asyncio.run then raises becomes KeyboardInterrupt below.
        loop = asyncio._get_running_loop()  # this thread's running loop, or None
        if loop is None:
            raise KeyboardInterrupt
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.call_soon_threadsafe(lambda: None)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except asyncio.CancelledError:
        if not stop.requested:
            raise
        raise KeyboardInterrupt from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def tune(
    target: TargetArg = None,
    drafter: DrafterArg = None,
    max_draft_len: MaxDraftLenOpt = None,
    profile: ProfileOpt = None,
    method: MethodOpt = "auto",
    engine: TuneEngineOpt = "auto",
    concurrency: ConcurrencyOpt = None,
    workload: WorkloadOpt = None,
    time_scale: TimeScaleOpt = None,
    num_prompts: NumPromptsOpt = None,
    max_tokens: MaxTokensOpt = None,
    repeats: RepeatsOpt = 1,
    out: TuneOutOpt = Path("tune"),
    resume: ResumeOpt = False,
    force: ForceOpt = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    threads: ThreadsOpt = None,
    max_batch_size: TuneMaxBatchOpt = None,
    max_seq_len: MaxSeqOpt = None,
    trtllm_version: TrtllmVersionOpt = None,
    trtllm_backend: TrtllmBackendOpt = "pytorch",
    gpu: TuneGpuOpt = "auto",
    tp: TpOpt = 1,
    gpus: GpusOpt = None,
    launcher: LauncherOpt = "local",
    pp: PpOpt = 1,
    ep: EpOpt = 1,
    attention_dp: AttentionDpOpt = False,
    nodes: NodesOpt = 1,
    gpus_per_node: GpusPerNodeOpt = None,
    ready_timeout: ReadyTimeoutOpt = None,
    confidence: ConfidenceOpt = 0.95,
    seed: SeedOpt = 0,
    min_gain: MinGainOpt = 0.0,
    budget: BudgetOpt = 30.0,
    objective: ObjectiveOpt = DEFAULT_OBJECTIVE,
    temperature: TemperatureOpt = 0.0,
    top_p: TopPOpt = 1.0,
    request_rate: RequestRateOpt = None,
    burstiness: BurstinessOpt = 1.0,
    capacity: CapacityOpt = False,
    slo: SloOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    predict_only: PredictOnlyOpt = False,
    acceptance_length: AcceptanceLengthOpt = None,
    acceptance_rate: AcceptanceRateOpt = None,
    acceptance_from: AcceptanceFromOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure baseline and speculation per concurrency; write the best draft length per
    concurrency (draft_len_schedule), decision.json, tune.json, report.md and plots to --out.

    No arguments: the demo profile's four methods on the embedded engine, compared (about 5-10
    minutes on 2 CPU cores). Main options first; the other panels follow a run's order.
    """
    from spectool.decide.slo import parse_slo, resolve_objective
    from spectool.tuning.rates import parse_rates
    from spectool.tuning.request import TuneRequest, parse_concurrencies

    request = TuneRequest(
        target=target,
        drafter=drafter,
        profile=profile,
        method=method,
        max_draft_len=max_draft_len,
        engine=engine,
        concurrencies=parse_concurrencies(concurrency) if concurrency is not None else None,
        workload=workload,
        num_prompts=num_prompts,
        max_tokens=max_tokens,
        repeats=repeats,
        out=out,
        resume=resume,
        force=force,
        device=device,
        dtype=dtype,
        threads=threads,
        max_batch_size=max_batch_size,
        max_seq_len=max_seq_len,
        trtllm_version=trtllm_version,
        trtllm_backend=trtllm_backend,
        gpu=gpu,
        tp=tp,
        gpus=gpus,
        launcher=launcher,
        pp=pp,
        ep=ep,
        attention_dp=attention_dp,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        ready_timeout_s=ready_timeout,
        trust_remote_code=trust_remote_code,
        confidence=confidence,
        seed=seed,
        min_gain=min_gain,
        budget_s=budget,
        objective=resolve_objective(objective, parse_slo(slo)),
        temperature=temperature,
        top_p=top_p,
        time_scale=time_scale,
        request_rates=parse_rates(request_rate),
        burstiness=burstiness,
        capacity=capacity,
        slo=parse_slo(slo),
    )
    from spectool.inputs import check_pair_options

    check_pair_options(request)  # bad input (exit 2), the same rule as check and build
    acceptance = (acceptance_length, acceptance_rate, acceptance_from)
    if not predict_only and not request.plain_tp:
        from spectool.errors import BadInputError

        raise BadInputError(
            "--pp/--ep/--attention-dp/--nodes",
            "a measured tune runs on --tp GPUs of one node; a parallel layout is predicted "
            "only (--predict-only)",
        )
    if predict_only:
        from spectool.cli.tune_predicted import predict_only

        predict_only(request, *acceptance, as_json=as_json)
        return
    if any(a is not None for a in acceptance):
        from spectool.errors import BadInputError

        raise BadInputError("--acceptance-*", "acceptance inputs go with --predict-only")
    from spectool.cli.output import err_console
    from spectool.cli.tune_output import methods_json, render, render_methods, summary_json
    from spectool.tuning.compare import method_requests
    from spectool.tuning.outcome import TuneOutcome

    requests = method_requests(request)
    stop = _StopRequest()
    live = err_console.is_terminal and not as_json
    try:
        # SIGTERM (and its CancelledError when SIGINT is ignored) leaves as KeyboardInterrupt
        with _sigterm_as_interrupt(stop):
            if live:
                with RichTuneProgress() as progress:
                    result, rates, found = _run(requests, progress, stop)
            elif not as_json:
                result, rates, found = _run(requests, PlainTuneProgress(), stop)
            else:
                result, rates, found = _run(requests, None, stop)
    except KeyboardInterrupt:
        err_console.print(
            f"stopped; finished trials are saved under {Path(out)}: rerun with --resume to "
            "continue",
            markup=False,
        )
        raise
    if as_json:
        from spectool.cli.output import print_json

        single = isinstance(result, TuneOutcome)
        data = summary_json(result) if single else methods_json(result)
        if rates:
            data["rates"] = [c.to_json() for c in rates]
        if found is not None:
            from spectool.tuning.capacity import summary

            data["capacity"] = summary(found, request.slo)
        print_json(data)
        return
    if isinstance(result, TuneOutcome):
        render(result)
    else:
        render_methods(result)
    if rates:
        from spectool.cli.output import console
        from spectool.tuning.rates import report_lines

        console.print("\n".join(report_lines(rates, request.objective)), markup=False)
    if found is not None:
        from spectool.cli.output import console
        from spectool.tuning.capacity import sentence

        console.print(sentence(found), markup=False)


def _run(
    requests: list[TuneRequest], progress: TuneProgress | None, stop: _StopRequest
) -> tuple[TuneOutcome | MethodsOutcome, list[RateCell], Search | None]:
    """The choice (:func:`_choose`), then the deployment at the users' arrival rates
    (:func:`spectool.tuning.rates.run_rates`, when --request-rate or a trace asks for them)
    and its capacity at the SLO (:func:`spectool.tuning.capacity.run_capacity`, --capacity)."""
    from spectool.tuning.outcome import TuneOutcome
    from spectool.tuning.rates import run_rates

    result = _choose(requests, progress, stop)
    single = result if isinstance(result, TuneOutcome) else result.chosen
    out = single.out if isinstance(result, TuneOutcome) else result.out
    cells, _ = run_rates(
        single.resolved, single.result.choices, out, progress=progress, should_stop=stop
    )
    found = None
    if single.resolved.request.capacity:
        from spectool.tuning.capacity import run_capacity

        found, _ = run_capacity(
            single.resolved,
            dict(single.result.choices),
            out,
            single.resolved.request.slo,
            measured_in=single.out,
            progress=progress,
            should_stop=stop,
        )
    return result, cells, found


def _choose(
    requests: list[TuneRequest], progress: TuneProgress | None, stop: _StopRequest
) -> TuneOutcome | MethodsOutcome:
    """One method: its run. Several: every method's run in its folder, then the comparison."""
    from spectool.tuning.compare import resolve_all, run_methods
    from spectool.tuning.duel import run_duel
    from spectool.tuning.request import resolve
    from spectool.tuning.session import run_tune
    from spectool.tuning.together import can_share, run_joint

    if len(requests) == 1:
        return run_tune(resolve(requests[0]), progress=progress, should_stop=stop)
    resolved = resolve_all(requests)
    duel = lambda a, b, concs: run_duel(  # noqa: E731
        a,
        b,
        concs,
        on_message=None if progress is None else progress.on_message,
        should_stop=stop,
    )
    if can_share(resolved):  # one server holds every method: cells measured together
        return run_joint(resolved, progress=progress, should_stop=stop, duel=duel)
    return run_methods(
        resolved,
        lambda r, rival, baselines: run_tune(
            r, progress=progress, should_stop=stop, rival=rival, baselines=baselines
        ),
        on_message=None if progress is None else progress.on_message,
        duel=duel,
    )


def register(app: typer.Typer) -> None:
    app.command("tune", cls=command_class(help_defaults))(tune)
