"""Load trials against a running server: closed-loop concurrency or open-loop Poisson arrivals.

A trial (:class:`TrialConfig`) sends ``num_prompts`` requests, after ``warmup_requests`` that are
not recorded, in one of two modes:

* **closed loop** (``concurrency=N``): N workers, each sending its next prompt as soon as its
  previous request finished, so N requests are in flight (vLLM ``--max-concurrency``, GuideLLM
  ``concurrent``);
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

Record times are shifted so that ``0.0`` is the trial start. ``wall_time_s`` runs from the
trial start to the end of the last request.

Persistence: :func:`run_trials` appends each finished trial as one fsync'd JSON line (format
:data:`TRIAL_FORMAT`) and skips trials whose :meth:`TrialConfig.key` is already in the file, so
an interrupted sweep resumes where it stopped (:func:`load_trials`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from spectool.decide.latency import LatencySummary, RequestRecord, summarize
from spectool.errors import BadInputError
from spectool.io import append_line
from spectool.measure.client import (
    TOKEN_COUNT_SOURCES,
    RequestOptions,
    StreamingClient,
    StreamResult,
)
from spectool.measure.workloads import Prompt, workload_id
from spectool.trtllm.iter_stats import IterationStats, parse_iteration_stats

TRIAL_FORMAT = "spectool.trial/1"
METRICS_PATH = "/metrics"  # TensorRT-LLM's (and spectool's) iteration stats


@dataclass(frozen=True)
class TrialConfig:
    """Everything that defines one trial's measurement except the server's address.

    Exactly one of ``concurrency`` (closed loop) and ``rate_per_s`` (open loop, Poisson) is set.
    ``label`` names the server-side setting under test (e.g. ``"eagle3 k=3"``); trials with equal
    configs are the same trial for resuming, so the label must tell server settings apart.
    ``max_tokens`` is the output length of prompts that carry none of their own.
    ``workload_id`` is :func:`~spectool.measure.workloads.workload_id` of the prompts (checked
    by :func:`run_trial` when set). ``prompt_offset``: measured request ``i`` sends prompt
    ``(prompt_offset + i) % len(prompts)`` (short blocks of one cell cycle through the prompts).
    """

    label: str
    concurrency: int | None = None
    rate_per_s: float | None = None
    num_prompts: int = 64
    max_tokens: int = 128
    warmup_requests: int = 0
    time_limit_s: float | None = None
    seed: int = 0
    workload_id: str = ""
    request: RequestOptions = dataclasses.field(default_factory=RequestOptions)
    prompt_offset: int = 0

    def __post_init__(self) -> None:
        where = f"trial {self.label!r}"
        if (self.concurrency is None) == (self.rate_per_s is None):
            raise BadInputError(where, "set exactly one of concurrency and rate_per_s")
        if self.concurrency is not None and (
            isinstance(self.concurrency, bool) or self.concurrency < 1
        ):
            raise BadInputError(where, f"concurrency must be >= 1, got {self.concurrency}")
        if self.rate_per_s is not None and not self.rate_per_s > 0:
            raise BadInputError(where, f"rate_per_s must be > 0, got {self.rate_per_s}")
        if self.num_prompts < 1 or self.max_tokens < 1 or self.warmup_requests < 0:
            raise BadInputError(
                where, "need num_prompts >= 1, max_tokens >= 1 and warmup_requests >= 0"
            )
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise BadInputError(where, f"time_limit_s must be > 0, got {self.time_limit_s}")
        if self.prompt_offset < 0:
            raise BadInputError(where, f"prompt_offset must be >= 0, got {self.prompt_offset}")

    @property
    def mode(self) -> Literal["closed", "open"]:
        """``"closed"`` for a concurrency level, ``"open"`` for an arrival rate."""
        return "closed" if self.concurrency is not None else "open"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (``request`` nested; ``prompt_offset`` only when set, so
        trials saved before it existed keep their keys)."""
        data = dataclasses.asdict(self)
        if not self.prompt_offset:
            del data["prompt_offset"]
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "trial config") -> TrialConfig:
        """Inverse of :meth:`to_dict`; unknown or wrongly typed keys are a BadInputError."""
        if not isinstance(data, dict) or not isinstance(data.get("request", {}), dict):
            raise BadInputError(where, "expected a JSON object with an object 'request'")
        fields = dict(data)
        try:
            fields["request"] = RequestOptions(**fields.get("request", {}))
            return cls(**fields)
        except TypeError as e:
            raise BadInputError(where, str(e)) from e

    def key(self) -> str:
        """Canonical JSON of the config: the identity of a trial in a results file."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class TrialResult:
    """One finished trial: records (times from trial start), polled iteration stats, wall time.

    ``token_count_sources[i]`` says how ``records[i]``'s chunk token counts were obtained
    (``usage``/``tokenizer``/``chunks``, see :mod:`spectool.measure.client`).
    ``raw_iteration_stats`` are the ``/metrics`` entries as the server sent them (what is
    persisted); ``iteration_stats`` their parsed form. ``arrival_offsets_s`` is the open-loop
    schedule (empty for closed loop). ``started_at`` is the UTC wall-clock start (ISO 8601).
    """

    config: TrialConfig
    records: tuple[RequestRecord, ...]
    token_count_sources: tuple[str, ...]
    iteration_stats: tuple[IterationStats, ...]
    raw_iteration_stats: tuple[dict[str, Any], ...]
    wall_time_s: float
    started_at: str
    arrival_offsets_s: tuple[float, ...] = ()
    metrics_error: str | None = None

    @property
    def errors(self) -> tuple[RequestRecord, ...]:
        """Records of failed requests."""
        return tuple(r for r in self.records if not r.ok)

    def latency(
        self,
        slo_ttft_ms: float | None = None,
        slo_tpot_ms: float | None = None,
        slo_e2e_ms: float | None = None,
    ) -> LatencySummary:
        """:func:`spectool.decide.latency.summarize` of the records over the wall time."""
        return summarize(
            self.records,
            max(self.wall_time_s, 1e-9),
            slo_ttft_ms=slo_ttft_ms,
            slo_tpot_ms=slo_tpot_ms,
            slo_e2e_ms=slo_e2e_ms,
        )

    def to_json(self) -> dict[str, Any]:
        """The persisted form (one JSON line of a results file)."""
        return {
            "format": TRIAL_FORMAT,
            "key": self.config.key(),
            "config": self.config.to_dict(),
            "started_at": self.started_at,
            "wall_time_s": self.wall_time_s,
            "records": [dataclasses.asdict(r) for r in self.records],
            "token_count_sources": list(self.token_count_sources),
            "arrival_offsets_s": list(self.arrival_offsets_s),
            "iteration_stats": list(self.raw_iteration_stats),
            "metrics_error": self.metrics_error,
        }

    @classmethod
    def from_json(cls, obj: Any, where: str = "trial") -> TrialResult:
        """Inverse of :meth:`to_json`; anything malformed is a BadInputError naming ``where``."""
        if not isinstance(obj, dict) or obj.get("format") != TRIAL_FORMAT:
            raise BadInputError(where, f"not a {TRIAL_FORMAT} object")
        config = TrialConfig.from_dict(obj.get("config"), where)
        raw_records = obj.get("records")
        raw_stats = obj.get("iteration_stats")
        sources = obj.get("token_count_sources")
        if not (
            isinstance(raw_records, list)
            and isinstance(raw_stats, list)
            and isinstance(sources, list)
            and len(sources) == len(raw_records)
            and all(s in TOKEN_COUNT_SOURCES for s in sources)
        ):
            raise BadInputError(where, "records, token_count_sources or iteration_stats malformed")
        try:
            records = tuple(RequestRecord(**r) for r in raw_records)
            wall_time_s = float(obj["wall_time_s"])
            offsets = tuple(float(t) for t in obj.get("arrival_offsets_s") or ())
        except (TypeError, KeyError, ValueError) as e:
            raise BadInputError(where, f"malformed trial: {e}") from e
        return cls(
            config=config,
            records=records,
            token_count_sources=tuple(sources),
            iteration_stats=tuple(parse_iteration_stats(raw_stats, where=where)),
            raw_iteration_stats=tuple(raw_stats),
            wall_time_s=wall_time_s,
            started_at=str(obj.get("started_at", "")),
            arrival_offsets_s=offsets,
            metrics_error=obj.get("metrics_error"),
        )


class Progress(Protocol):
    """Hooks a renderer implements (the CLI's rich progress); pass None to run quietly."""

    def on_trial_start(self, config: TrialConfig, num_requests: int) -> None:
        """A trial's measured requests are about to start (warmup is done)."""

    def on_request_done(self, config: TrialConfig, result: StreamResult) -> None:
        """One measured request finished (successfully or not)."""

    def on_trial_done(self, result: TrialResult) -> None:
        """A trial finished and, with a results file, was saved."""


def poisson_arrival_offsets_s(rate_per_s: float, num_requests: int, seed: int) -> np.ndarray:
    """Send offsets (s) of ``num_requests`` Poisson arrivals: 0, then exponential gaps.

    The gaps are ``numpy.random.default_rng(seed).exponential(1 / rate_per_s, num_requests - 1)``.
    """
    if not rate_per_s > 0 or num_requests < 0:
        raise BadInputError("arrival rate", "need rate_per_s > 0 and num_requests >= 0")
    if num_requests == 0:
        return np.zeros(0)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_s, size=num_requests - 1)
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
        where = self.client.base_url + path
        try:
            payload = await self.client.get_json(path)
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
    send: Callable[[int], Any],
) -> None:
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < num_requests and (
            deadline_s is None or time.perf_counter() < deadline_s
        ):
            index = next_index
            next_index += 1
            await send(index)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, num_requests))))


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

    async def warm(index: int) -> None:
        prompt = prompts[-(index + 1) % n_prompts]
        await client.stream(
            prompt,
            request_id=f"warmup-{index}",
            max_tokens=_max_tokens(prompt, config),
            options=config.request,
        )

    if config.warmup_requests:
        await _closed_loop(config.concurrency or 1, config.warmup_requests, None, warm)

    poller = _MetricsPoller(client, metrics_interval_s, metrics_path) if poll_metrics else None
    if poller is not None:  # drop warmup and earlier iterations, trailing ones included
        if config.warmup_requests and not poller.paged:
            await asyncio.sleep(metrics_interval_s)
        await poller.poll_once(keep=False)
    results: dict[int, StreamResult] = {}

    async def send(index: int) -> None:
        prompt = prompts[(config.prompt_offset + index) % n_prompts]
        result = await client.stream(
            prompt,
            request_id=f"r{index:05d}",
            max_tokens=_max_tokens(prompt, config),
            options=config.request,
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
    try:
        if config.concurrency is not None:
            await _closed_loop(config.concurrency, config.num_prompts, deadline_s, send)
        else:
            assert config.rate_per_s is not None  # TrialConfig guarantees one mode
            offsets = poisson_arrival_offsets_s(config.rate_per_s, config.num_prompts, config.seed)
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


def load_trials(path: str | Path) -> dict[str, TrialResult]:
    """Finished trials in a results file keyed by :meth:`TrialConfig.key` (later lines win).

    A missing file is empty. An unfinished last line (a crash while appending) is ignored; any
    other malformed line is a BadInputError naming the file and line.
    """
    path = Path(path)
    if not path.exists():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BadInputError(path, f"cannot read results: {e}") from e
    lines = text.split("\n")
    trials: dict[str, TrialResult] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last_unfinished = number == len(lines) and not text.endswith("\n")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if last_unfinished:
                break
            raise BadInputError(path, f"line {number}: not valid JSON: {e.msg}") from e
        try:
            trial = TrialResult.from_json(obj, where=f"{path}: line {number}")
        except BadInputError as e:
            raise BadInputError(path, f"line {number}: {e.problem}") from e
        trials[trial.config.key()] = trial
    return trials


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
) -> list[TrialResult]:
    """Run ``configs`` in order, skipping those already finished in ``results_path``.

    Each newly finished trial is appended to ``results_path`` before the next starts. Returns
    one result per config, loaded or new, in the order of ``configs``.
    """
    finished = load_trials(results_path) if results_path is not None else {}
    results: list[TrialResult] = []
    for config in configs:
        key = config.key()
        if key not in finished:
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
            )

    return asyncio.run(main())
