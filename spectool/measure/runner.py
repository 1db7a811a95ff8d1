"""Load trials against a running server: closed-loop concurrency or open-loop Poisson arrivals.

A trial (:class:`TrialConfig`) sends ``num_prompts`` requests, after ``warmup_requests`` that are
not recorded, in one of two modes:

* **closed loop** (``concurrency=N``): N workers, each sending its next prompt as soon as its
  previous request finished, so N requests are in flight (vLLM ``--max-concurrency``, GuideLLM
  ``concurrent``);
  With ``full_load``, only requests that run while every user has a request in flight are
  measured: the users' joining and the drain at the end are extra requests, not recorded, and
  those still running when the last measured one ends are cancelled (:func:`_full_load_loop`);
* **open loop** (``rate_per_s=R``): request ``i`` is sent at offset ``t_i`` from the trial start,
  ``t_0 = 0`` and ``t_i - t_(i-1)`` exponential with mean ``1/R`` drawn from
  ``numpy.random.default_rng(seed)`` (:func:`poisson_arrival_offsets_s`), whatever the server
  is doing (vLLM ``--request-rate``).

No request is sent after ``time_limit_s``; requests already in flight finish. Request ``i`` uses
prompt ``i mod len(prompts)``; warmup request ``j`` uses prompt ``-(j+1) mod len(prompts)`` so
that warmup does not fill a prefix cache with the first measured prompts.

While the trial runs, ``GET /metrics`` is polled every ``metrics_interval_s`` (TensorRT-LLM's
and spectool's server drain the queue on read, so every entry is kept). It is drained once
before the trial so warmup iterations are not counted, and read once more one interval after
the last response (iteration stats can trail the responses). A server without JSON iteration
stats (vLLM serves Prometheus text there) yields ``metrics_error`` and no iteration stats; the
trial itself goes on. Prompts repeat across trials, so a server with prefix caching
(TensorRT-LLM's KV block reuse) may serve later trials' prefills from cache: compare TTFT
across trials with that in mind; decode-step numbers are unaffected.

The client must not stop while a trial runs: a stalled load loop sends its requests late and
together (one batched prefill, long TTFTs, then decoding that no arriving prefill interrupts:
time moves from TPOT into TTFT). Python's full garbage collection is such a stop: it traverses
every object the process holds, and a tune run holds its trials (some 290,000 objects by the
end of the main job: 125-146 ms a collection on the 2-core machine). So before each trial all
objects held so far are frozen (``gc.freeze``: out of every later collection); the trial's own
young objects are still collected. Without it the main job's concurrency-16 cell had a
baseline block whose requests arrived in a burst (TTFT 361 ms against 100-176, TPOT 21.7 ms
against 31-38) at the same block of the same cell in two runs of six.

Record times are shifted so that ``0.0`` is the trial start. ``wall_time_s`` runs from the
trial start to the end of the last request.

Persistence: :func:`run_trials` appends each finished trial as one fsync'd JSON line (format
:data:`~spectool.measure.trial.TRIAL_FORMAT`) and skips trials whose
:meth:`~spectool.measure.trial.TrialConfig.key` is already in the file, so an interrupted sweep
resumes where it stopped (:func:`~spectool.measure.trial.load_trials`). The trial types and the
results file live in :mod:`spectool.measure.trial`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from spectool.decide.latency import RequestRecord
from spectool.errors import BadInputError
from spectool.io import append_line
from spectool.measure.client import (
    StreamingClient,
    StreamResult,
)
from spectool.measure.trial import Progress, TrialConfig, TrialResult, load_trials
from spectool.measure.workloads import Prompt, workload_id
from spectool.trtllm.iter_stats import IterationStats, parse_iteration_stats

METRICS_PATH = "/metrics"  # TensorRT-LLM's (and spectool's) iteration stats


def poisson_arrival_offsets_s(
    rate_per_s: float, num_requests: int, seed: int, burstiness: float = 1.0
) -> np.ndarray:
    """Send offsets (s) of ``num_requests`` arrivals at mean rate ``rate_per_s``: 0, then gaps.

    Poisson (``burstiness`` 1): the gaps are
    ``numpy.random.default_rng(seed).exponential(1 / rate_per_s, num_requests - 1)``. Otherwise
    gamma gaps of shape ``burstiness`` and the same mean, as vLLM's ``--burstiness``
    (``benchmarks/benchmark_serving.py``: ``np.random.gamma(shape=burstiness, scale=theta)``,
    ``theta = 1 / (request_rate * burstiness)``): below 1 the arrivals come in bursts, above 1
    more evenly; the coefficient of variation of a gap is ``1 / sqrt(burstiness)``.
    """
    if not rate_per_s > 0 or num_requests < 0 or not burstiness > 0:
        raise BadInputError(
            "arrival rate", "need rate_per_s > 0, burstiness > 0 and num_requests >= 0"
        )
    if num_requests == 0:
        return np.zeros(0)
    rng = np.random.default_rng(seed)
    if burstiness == 1.0:
        gaps = rng.exponential(1.0 / rate_per_s, size=num_requests - 1)
    else:
        gaps = rng.gamma(burstiness, 1.0 / (rate_per_s * burstiness), size=num_requests - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def _shift(record: RequestRecord, t0: float) -> RequestRecord:
    first = record.first_token_time_s
    return dataclasses.replace(
        record,
        send_time_s=record.send_time_s - t0,
        first_token_time_s=None if first is None else first - t0,
        chunk_times_s=tuple(t - t0 for t in record.chunk_times_s),
        end_time_s=record.end_time_s - t0,
    )


def _iteration_numbers(payload: Any) -> list[int] | None:
    """The ``iter`` numbers of a list of iteration records (None: not such a list)."""
    if not isinstance(payload, list) or not all(
        isinstance(e, dict) and isinstance(e.get("iter"), int) for e in payload
    ):
        return None
    return [e["iter"] for e in payload]


class _MetricsPoller:
    """Polls ``/metrics`` in the background; keeps every entry until the first failure."""

    def __init__(self, client: StreamingClient, interval_s: float, path: str) -> None:
        self.client = client
        self.interval_s = interval_s
        self.path = path
        self.after = -1  # a path with ``{after}`` pages by iteration number (nothing drained)
        self.raw: list[dict[str, Any]] = []
        self.parsed: list[IterationStats] = []
        self.error: str | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def poll_once(self, keep: bool = True) -> None:
        if self.error is not None:
            return
        path = self.path.format(after=self.after) if "{after}" in self.path else self.path
        if not keep and self.paged and self.path.startswith("/spectool/"):
            path += "&last=1"  # spectool's server: the newest record says where a trial starts
        where = self.client.base_url + path
        try:
            payload = await self.client.get_json(path)
            numbers = _iteration_numbers(payload) if not keep and self.paged else None
            if numbers is not None:
                # only where the trial's iterations start: the numbers, not the records
                # (a paged server returns its whole history here, up to 1000 records)
                self.after = max([self.after, *numbers])
                return
            parsed = parse_iteration_stats(payload, where=where)
        except Exception as e:  # no JSON iteration stats here: note it, stop polling
            self.error = f"{where}: {type(e).__name__}: {e}"
            return
        numbers = [it.iter for it in parsed if it.iter is not None]
        if numbers:
            self.after = max(self.after, *numbers)
        if keep:
            self.raw.extend(payload)
            self.parsed.extend(parsed)

    async def _loop(self) -> None:
        while not self._stop.is_set() and self.error is None:
            await self.poll_once()
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.interval_s)
            except asyncio.TimeoutError:
                pass

    @property
    def paged(self) -> bool:
        """Whether the path pages by iteration number (``{after}``): nothing is drained, so
        one read after the trial gets every iteration, and spectool's server records a step's
        stats before it sends the step's tokens, so nothing trails the last response."""
        return "{after}" in self.path

    def start(self) -> None:
        if not self.paged:
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Stop polling, then read once more (after one interval where stats may trail)."""
        self._stop.set()
        if self._task is not None:
            await self._task
        if not self.paged:
            await asyncio.sleep(self.interval_s)
        await self.poll_once()


async def _closed_loop(
    concurrency: int,
    num_requests: int,
    deadline_s: float | None,
    send: Callable[[int, Callable[[], None] | None], Any],
) -> None:
    """``concurrency`` users, each sending its next request when its last one ends.

    The users join one at a time: each sends its first request once the previous user's
    first request has its first token (it has left the server's prefill). Started together,
    requests of one output length would run in lockstep for ever: all prefilled in one step,
    all finishing on one step, all replaced at once, so no prefill ever stalls another
    request's decoding. No real traffic does that, and it flatters the configuration whose
    requests finish together (without speculation they do; with it they finish apart and
    each arrival's prefill stalls the others): measured on the embedded engine, code prompts,
    concurrency 4, draft_model k=2, blocks of 16 requests, 10 interleaved rounds: 0.84x in
    lockstep, 1.10x with users joining one at a time, 1.12x with the same prompts at
    staggered output lengths (CHANGELOG, 2026-12-04).
    """
    next_index = 0
    users = min(concurrency, num_requests)
    joined = [asyncio.Event() for _ in range(users)]

    async def user(u: int) -> None:
        nonlocal next_index
        if u > 0:
            await joined[u - 1].wait()
        try:
            while next_index < num_requests and (
                deadline_s is None or time.perf_counter() < deadline_s
            ):
                index = next_index
                next_index += 1
                await send(index, None if joined[u].is_set() else joined[u].set)
        finally:
            joined[u].set()  # the next user never waits on one that stopped

    await asyncio.gather(*(user(u) for u in range(users)))


async def _full_load_loop(
    concurrency: int,
    measured: int,
    send: Callable[[int, Callable[[], None] | None], Any],
    extra: Callable[[int, Callable[[], None] | None], Any],
) -> None:
    """``concurrency`` users as in :func:`_closed_loop`, measured at full load only.

    The users join one at a time as there, and ``send`` sends the ``measured`` requests once
    every user has joined and the loop has turned over once more (``concurrency`` further
    requests sent). Before that (the users joining, the first turnover) and after the measured
    requests have all gone out (keeping every user busy while the last measured ones finish),
    users send ``extra`` requests, which are not measured; when the last measured request ends,
    the extra ones still in flight are cancelled (the client disconnects, and the server aborts
    them). So every measured request runs with ``concurrency`` requests in flight from its
    start to its end, as under sustained load, instead of in the ramp, the drain, or the
    first turnover after the ramp. Why the turnover: on the embedded engine (draft model,
    ``k=4``, built-in workload, concurrency 16, 4 rounds of 160-request blocks), requests of
    the first two waves were 0.91x and 0.95x as slow per token with speculation as without,
    and every later wave 0.93-1.05x (0.986 overall): the first turnover is still transient.
    """
    users = concurrency  # extra requests keep them all busy, however few are measured
    joined = [asyncio.Event() for _ in range(users)]
    ended = asyncio.Event()
    sent = {"measured": 0, "extra": 0, "ended": 0, "settle": users}

    async def user(u: int) -> None:
        if u > 0:
            await joined[u - 1].wait()
        hook: Callable[[], None] | None = joined[u].set
        try:
            while not ended.is_set():
                first, hook = hook, None
                full = joined[-1].is_set()
                settling = full and sent["settle"] > 0  # the loop's first turnover
                if settling:
                    sent["settle"] -= 1
                if full and not settling and sent["measured"] < measured:
                    index = sent["measured"]
                    sent["measured"] += 1
                    await send(index, first)
                    sent["ended"] += 1
                    if sent["ended"] == measured:
                        ended.set()
                else:
                    index = sent["extra"]
                    sent["extra"] += 1
                    await extra(index, first)
        finally:
            joined[u].set()  # the next user never waits on one that stopped

    tasks = [asyncio.create_task(user(u)) for u in range(users)]
    waiter = asyncio.create_task(ended.wait())
    try:
        await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiter, *tasks):
            task.cancel()
        outcomes = await asyncio.gather(waiter, *tasks, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, Exception):
            raise outcome


async def _open_loop(
    offsets_s: np.ndarray, t0: float, deadline_s: float | None, send: Callable[[int], Any]
) -> None:
    tasks: list[asyncio.Task[Any]] = []
    for index, offset in enumerate(offsets_s):
        at = t0 + float(offset)
        if deadline_s is not None and at >= deadline_s:
            break
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(index)))
    await asyncio.gather(*tasks)


def _max_tokens(prompt: Prompt, config: TrialConfig) -> int:
    return prompt.max_tokens if prompt.max_tokens is not None else config.max_tokens


async def run_trial(
    client: StreamingClient,
    prompts: Sequence[Prompt],
    config: TrialConfig,
    *,
    progress: Progress | None = None,
    metrics_interval_s: float = 0.5,
    poll_metrics: bool = True,
    metrics_path: str = METRICS_PATH,
) -> TrialResult:
    """Run one trial (warmup, then the measured requests) and return its result."""
    if not prompts:
        raise BadInputError(f"trial {config.label!r}", "no prompts")
    if config.workload_id and config.workload_id != workload_id(prompts):
        raise BadInputError(
            f"trial {config.label!r}",
            f"workload_id {config.workload_id} does not match the prompts ({workload_id(prompts)})",
        )
    n_prompts = len(prompts)

    def unrecorded(prefix: str, prompt_at: Callable[[int], Prompt]) -> Callable[..., Any]:
        """A sender of requests that are not recorded (warmup, a full-load trial's extras)."""

        async def stream(index: int, on_first_chunk: Callable[[], None] | None = None) -> None:
            prompt = prompt_at(index)
            await client.stream(
                prompt,
                request_id=f"{prefix}-{index}",
                max_tokens=_max_tokens(prompt, config),
                options=config.request,
                on_first_chunk=on_first_chunk,
            )

        return stream

    warm = unrecorded("warmup", lambda i: prompts[-(i + 1) % n_prompts])
    if config.warmup_requests:
        await _closed_loop(config.concurrency or 1, config.warmup_requests, None, warm)

    poller = _MetricsPoller(client, metrics_interval_s, metrics_path) if poll_metrics else None
    if poller is not None:  # drop warmup and earlier iterations, trailing ones included
        if config.warmup_requests and not poller.paged:
            await asyncio.sleep(metrics_interval_s)
        await poller.poll_once(keep=False)
    results: dict[int, StreamResult] = {}

    async def send(index: int, on_first_chunk: Callable[[], None] | None = None) -> None:
        order = config.prompt_indices
        position = order[index % len(order)] if order else config.prompt_offset + index
        prompt = prompts[position % n_prompts]
        result = await client.stream(
            prompt,
            request_id=f"r{index:05d}",
            max_tokens=_max_tokens(prompt, config),
            options=config.request,
            on_first_chunk=on_first_chunk,
        )
        results[index] = result
        if progress is not None:
            progress.on_request_done(config, result)

    if progress is not None:
        progress.on_trial_start(config, config.num_prompts)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if poller is not None:
        poller.start()
    t0 = time.perf_counter()
    deadline_s = None if config.time_limit_s is None else t0 + config.time_limit_s
    offsets = np.zeros(0)

    block = config.prompt_indices or tuple(range(config.num_prompts))
    # a full-load trial's extra requests send the block's own prompts, in reverse
    extra = unrecorded("extra", lambda i: prompts[block[-(i + 1) % len(block)] % n_prompts])

    try:
        if config.concurrency is not None and config.full_load:
            await _full_load_loop(config.concurrency, config.num_prompts, send, extra)
        elif config.concurrency is not None:
            await _closed_loop(config.concurrency, config.num_prompts, deadline_s, send)
        else:
            assert config.rate_per_s is not None  # TrialConfig guarantees one mode
            offsets = (
                np.array(config.arrivals_s, dtype=float)
                if config.arrivals_s
                else poisson_arrival_offsets_s(
                    config.rate_per_s, config.num_prompts, config.seed, config.burstiness
                )
            )
            await _open_loop(offsets, t0, deadline_s, send)
        wall_time_s = time.perf_counter() - t0
    finally:
        if poller is not None:
            await poller.stop()
    done = [results[i] for i in sorted(results)]
    result = TrialResult(
        config=config,
        records=tuple(_shift(r.record, t0) for r in done),
        token_count_sources=tuple(r.token_count_source for r in done),
        iteration_stats=tuple(poller.parsed) if poller else (),
        raw_iteration_stats=tuple(poller.raw) if poller else (),
        wall_time_s=wall_time_s,
        started_at=started_at,
        arrival_offsets_s=tuple(float(t) for t in offsets),
        metrics_error=poller.error if poller else None,
    )
    return result


async def run_trials(
    client: StreamingClient,
    prompts: Sequence[Prompt],
    configs: Sequence[TrialConfig],
    *,
    results_path: str | Path | None = None,
    progress: Progress | None = None,
    metrics_interval_s: float = 0.5,
    poll_metrics: bool = True,
    metrics_path: str = METRICS_PATH,
    finished: Mapping[str, TrialResult] | None = None,
) -> list[TrialResult]:
    """Run ``configs`` in order, skipping those already finished in ``results_path``.

    Each newly finished trial is appended to ``results_path`` before the next starts. Returns
    one result per config, loaded or new, in the order of ``configs``. ``finished``: the
    trials of ``results_path`` as the caller already holds them (a caller measuring block by
    block passes them rather than have the growing file parsed again before every block).
    """
    if finished is not None:
        finished = dict(finished)
    else:
        finished = load_trials(results_path) if results_path is not None else {}
    results: list[TrialResult] = []
    for config in configs:
        key = config.key()
        if key not in finished:
            gc.freeze()  # no full collection stops the trial's load loop (module docstring)
            trial = await run_trial(
                client,
                prompts,
                config,
                progress=progress,
                metrics_interval_s=metrics_interval_s,
                poll_metrics=poll_metrics,
                metrics_path=metrics_path,
            )
            if results_path is not None:
                append_line(results_path, json.dumps(trial.to_json(), separators=(",", ":")))
            finished[key] = trial
            if progress is not None:
                progress.on_trial_done(trial)
        results.append(finished[key])
    return results


def measure(
    base_url: str,
    model: str,
    prompts: Sequence[Prompt],
    configs: Sequence[TrialConfig],
    *,
    results_path: str | Path | None = None,
    progress: Progress | None = None,
    count_tokens: Callable[[str], int] | None = None,
    metrics_interval_s: float = 0.5,
    poll_metrics: bool = True,
    metrics_path: str = METRICS_PATH,
    finished: Mapping[str, TrialResult] | None = None,
) -> list[TrialResult]:
    """Blocking :func:`run_trials` against ``base_url`` (for the CLI, outside any event loop)."""

    async def main() -> list[TrialResult]:
        async with StreamingClient(base_url, model, count_tokens=count_tokens) as client:
            return await run_trials(
                client,
                prompts,
                configs,
                results_path=results_path,
                progress=progress,
                metrics_interval_s=metrics_interval_s,
                poll_metrics=poll_metrics,
                metrics_path=metrics_path,
                finished=finished,
            )

    return asyncio.run(main())
