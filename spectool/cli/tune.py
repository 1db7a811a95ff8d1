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
from typing import TYPE_CHECKING, Annotated, Any

import typer

from spectool.cli.options import (
    DrafterArg,
    GpuOpt,
    JsonOpt,
    MaxBatchOpt,
    MaxDraftLenOpt,
    MaxSeqOpt,
    MethodOpt,
    ProfileOpt,
    TargetArg,
    TpOpt,
    TrtllmBackendOpt,
    TrtllmVersionOpt,
    TrustRemoteCodeOpt,
)

if TYPE_CHECKING:
    from spectool.measure.client import StreamResult
    from spectool.measure.runner import TrialConfig, TrialResult
    from spectool.tuning.driver import ServerInfo
    from spectool.tuning.outcome import TuneOutcome

TuneEngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="auto (trtllm when trtllm-serve is installed, else torch), trtllm, or torch "
        "(spectool's embedded engine).",
    ),
]
ConcurrencyOpt = Annotated[
    str | None,
    typer.Option(
        "--concurrency",
        help="Comma-separated concurrency levels (default: 1,2,4,8 on torch, 1,2,4,8,16,32 on "
        "trtllm).",
    ),
]
WorkloadOpt = Annotated[
    Path | None,
    typer.Option(
        "--workload",
        help="Prompt JSONL file (Spec-Bench question.jsonl or {prompt, max_tokens?, category?} "
        "lines). Default: built-in prompts from the Python standard library.",
    ),
]
NumPromptsOpt = Annotated[
    int | None,
    typer.Option(
        "--num-prompts",
        help="Measured requests per trial, at least 2 x concurrency (default 16 torch, 64 trtllm).",
    ),
]
MaxTokensOpt = Annotated[
    int | None,
    typer.Option("--max-tokens", help="Output tokens per request (default 32 torch, 256 trtllm)."),
]
RepeatsOpt = Annotated[int, typer.Option("--repeats", help="Trials per measured cell, pooled.")]
TuneOutOpt = Annotated[Path, typer.Option("--out", help="Output folder.")]
ResumeOpt = Annotated[
    bool,
    typer.Option("--resume", help="Continue a run in --out; finished trials are not redone."),
]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Start over in an --out that holds earlier results.")
]
DeviceOpt = Annotated[str, typer.Option("--device", help="torch: cpu, cuda, cuda:N or auto.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="torch: float32, bfloat16, float16.")]
ThreadsOpt = Annotated[
    int | None,
    typer.Option("--threads", help="torch: server threads (default: all cores but one)."),
]
ReadyTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--ready-timeout",
        help="Seconds a server may take to load (default 600 torch, 1800 trtllm).",
    ),
]
ConfidenceOpt = Annotated[
    float, typer.Option("--confidence", help="Confidence of the decision's intervals.")
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the prompts and the bootstrap.")]
BudgetOpt = Annotated[
    float,
    typer.Option(
        "--budget",
        help="Seconds of measuring per speculative cell: paired blocks are added until the "
        "cell is settled or this is spent (then it is inconclusive).",
    ),
]
MinGainOpt = Annotated[
    float,
    typer.Option(
        "--min-gain", help="Choose speculation only if it beats the baseline by this fraction."
    ),
]


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
        self._task: Any = None

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
        self._task = self.progress.add_task(f"  c={config.concurrency} {label}", total=num_requests)

    def on_request_done(self, config: TrialConfig, result: StreamResult) -> None:
        if self._task is not None:
            self.progress.advance(self._task)

    def on_trial_done(self, result: TrialResult) -> None:
        if self._task is not None:
            self.progress.remove_task(self._task)
            self._task = None
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

    def handler(_signum: int, _frame: FrameType | None) -> None:
        stop.requested = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
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
    num_prompts: NumPromptsOpt = None,
    max_tokens: MaxTokensOpt = None,
    repeats: RepeatsOpt = 1,
    out: TuneOutOpt = Path("tune"),
    resume: ResumeOpt = False,
    force: ForceOpt = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    threads: ThreadsOpt = None,
    max_batch_size: MaxBatchOpt = None,
    max_seq_len: MaxSeqOpt = None,
    trtllm_version: TrtllmVersionOpt = None,
    trtllm_backend: TrtllmBackendOpt = "pytorch",
    gpu: GpuOpt = "auto",
    tp: TpOpt = 1,
    ready_timeout: ReadyTimeoutOpt = None,
    confidence: ConfidenceOpt = 0.95,
    seed: SeedOpt = 0,
    min_gain: MinGainOpt = 0.0,
    budget: BudgetOpt = 30.0,
    trust_remote_code: TrustRemoteCodeOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Measure baseline and speculation per concurrency; write the best draft length per
    concurrency (draft_len_schedule), decision.json, tune.json, report.md and plots to --out.

    No arguments: the embedded demo pair on the embedded engine (~2 minutes on 2 CPU cores).
    """
    from spectool.tuning.request import TuneRequest, parse_concurrencies, resolve
    from spectool.tuning.session import run_tune

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
        ready_timeout_s=ready_timeout,
        trust_remote_code=trust_remote_code,
        confidence=confidence,
        seed=seed,
        min_gain=min_gain,
        budget_s=budget,
    )
    from spectool.cli.output import err_console

    stop = _StopRequest()
    with _sigterm_as_interrupt(stop):
        resolved = resolve(request)
        live = err_console.is_terminal and not as_json
        try:
            if live:
                with RichTuneProgress() as progress:
                    outcome = run_tune(resolved, progress=progress, should_stop=stop)
            elif not as_json:
                outcome = run_tune(resolved, progress=PlainTuneProgress(), should_stop=stop)
            else:
                outcome = run_tune(resolved, should_stop=stop)
        except KeyboardInterrupt:
            err_console.print(
                f"stopped; finished trials are saved in {Path(out) / 'trials.jsonl'}: rerun "
                "with --resume to continue",
                markup=False,
            )
            raise
    if as_json:
        from spectool.cli.output import print_json

        print_json(_summary_json(outcome))
    else:
        _render(outcome)


def _summary_json(outcome: TuneOutcome) -> dict[str, Any]:
    result = outcome.result
    return {
        "out": str(outcome.out),
        "decision": result.to_decision_json(),
        "runs": {
            "used": result.runs_used,
            "full_grid": result.full_grid_runs,
            "measured_now": len(result.measured_now),
            "reused": len(result.reused),
            "trials_measured_now": outcome.trials_measured_now,
        },
        "wall_s": outcome.wall_s,
        "files": [str(p) for p in outcome.files],
        "notes": list(outcome.notes),
    }


def _render(outcome: TuneOutcome) -> None:
    from rich.table import Table

    from spectool.cli.output import console

    result = outcome.result
    verdicts = {(v.concurrency, v.k): v for v in result.cells}
    table = Table(title=f"spectool tune: {outcome.resolved.method} on {result.engine}")
    for column in ("concurrency", "k", "ratio lhs/rhs", "95% CI", "verdict", "tok/s per user"):
        table.add_column(column, justify="right" if column != "verdict" else "left")
    for c in result.concurrencies:
        k = result.choices[c]
        v = verdicts.get((c, k))
        s = outcome.stats.get((c, k))
        per_user = f"{s.tokens_per_s_per_user.value:.1f}" if s is not None else "-"
        if v is None:
            best = min(
                (x for x in result.cells if x.concurrency == c), key=lambda x: x.ratio, default=None
            )
            note = "off" if best is None else f"off (k={best.k} {best.verdict.replace('_', ' ')})"
            table.add_row(str(c), "0", "-", "-", note, per_user)
        else:
            table.add_row(
                str(c),
                str(k),
                f"{v.ratio:.3f}",
                f"{v.ci_low:.3f}-{v.ci_high:.3f}",
                v.verdict.replace("_", " "),
                per_user,
            )
    console.print(table)
    be = result.break_even_concurrency
    top = max(result.concurrencies)
    console.print(
        f"break-even concurrency: {be}"
        if be is not None
        else f"break-even concurrency: none up to {top} (the server's batch limit is "
        f"{outcome.resolved.max_batch_size}): speculation pays at every concurrency measured"
    )
    console.print(f"decision: {schedule_in_words(result.choices)}")
    console.print(
        "draft_len_schedule (batch size -> draft length): "
        f"{dict(sorted(result.schedule.items())) or 'none (speculation off)'}"
    )
    console.print(
        f"runs: {result.runs_used} cells of the {result.full_grid_runs}-cell grid "
        f"({len(result.measured_now)} measured now, {len(result.reused)} reused); "
        f"{outcome.trials_measured_now} trials; {outcome.wall_s:.0f} s"
    )
    for note in outcome.notes:
        console.print(f"note: {note}", markup=False, style="yellow")
    console.print(f"wrote {len(outcome.files)} files to {outcome.out} (report: report.md)")


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)


def schedule_in_words(choices: dict[int, int]) -> str:
    """The per-concurrency choices as a person would say them: runs of equal draft lengths,
    e.g. ``k=4 at concurrency 1-8; speculation off at 16 and above``."""
    concs = sorted(choices)
    parts: list[str] = []
    start = 0
    for i in range(1, len(concs) + 1):
        if i < len(concs) and choices[concs[i]] == choices[concs[start]]:
            continue
        k, low, high = choices[concs[start]], concs[start], concs[i - 1]
        last = i == len(concs)
        if last and start > 0:
            where = f"{low} and above"
        else:
            where = f"{low}" if low == high else f"{low}-{high}"
        parts.append(f"speculation off at {where}" if k == 0 else f"k={k} at concurrency {where}")
        start = i
    return "; ".join(parts)
