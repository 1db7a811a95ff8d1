"""One trial's definition and result, and the results file that keeps finished trials.

:class:`TrialConfig` (what a trial measures), :class:`TrialResult` (its records and iteration
stats, persisted as one JSON line of format :data:`TRIAL_FORMAT`), :class:`Progress` (hooks a
renderer implements) and :func:`load_trials` (the finished trials of a results file). Running a
trial is :mod:`spectool.measure.runner`'s.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from spectool.decide.latency import LatencySummary, RequestRecord, summarize
from spectool.errors import BadInputError
from spectool.measure.client import TOKEN_COUNT_SOURCES, RequestOptions, StreamResult
from spectool.trtllm.iter_stats import IterationStats, parse_iteration_stats

TRIAL_FORMAT = "spectool.trial/1"


@dataclass(frozen=True)
class TrialConfig:
    """Everything that defines one trial's measurement except the server's address.

    Exactly one of ``concurrency`` (closed loop) and ``rate_per_s`` (open loop, Poisson) is set.
    ``label`` names the server-side setting under test (e.g. ``"eagle3 k=3"``); trials with equal
    configs are the same trial for resuming, so the label must tell server settings apart.
    ``max_tokens`` is the output length of prompts that carry none of their own.
    ``workload_id`` is :func:`~spectool.measure.workloads.workload_id` of the prompts (checked
    by :func:`run_trial` when set). ``prompt_offset``: measured request ``i`` sends prompt
    ``(prompt_offset + i) % len(prompts)``. ``prompt_indices`` (when given, instead of the
    offset): measured request ``i`` sends prompt ``prompt_indices[i % len(prompt_indices)]``
    (a paired block's share of a shuffled pass over the workload, :mod:`spectool.tuning.trials`).
    ``full_load`` (closed loop): only requests with ``concurrency`` in flight from start to end
    are measured (:mod:`spectool.measure.runner`).
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
    prompt_indices: tuple[int, ...] = ()
    # open loop: the gaps' gamma shape (1: Poisson; below 1 burstier, above 1 steadier), as
    # vLLM's ``--burstiness``; ``arrivals_s`` (when given): the send offsets themselves, a
    # trace's own timestamps (``rate_per_s`` is then the trace's mean rate, for the record)
    burstiness: float = 1.0
    arrivals_s: tuple[float, ...] = ()
    # closed loop: measure only requests that run with ``concurrency`` in flight all through
    # (the users joining and the drain are extra requests, not recorded; runner._full_load_loop)
    full_load: bool = False

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
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in self.prompt_indices):
            raise BadInputError(where, "prompt_indices must be whole numbers >= 0")
        if self.prompt_indices and self.prompt_offset:
            raise BadInputError(where, "give prompt_offset or prompt_indices, not both")
        if not self.burstiness > 0 or (self.burstiness != 1.0 and self.concurrency is not None):
            raise BadInputError(where, "burstiness must be > 0, and only with rate_per_s")
        if self.arrivals_s and (
            self.concurrency is not None
            or len(self.arrivals_s) != self.num_prompts
            or any(b < a for a, b in zip(self.arrivals_s, self.arrivals_s[1:], strict=False))
            or self.arrivals_s[0] < 0
        ):
            raise BadInputError(
                where, "arrivals_s needs rate_per_s and num_prompts offsets, >= 0, in order"
            )

        if self.full_load and (self.concurrency is None or self.time_limit_s is not None):
            raise BadInputError(where, "full_load needs concurrency and no time_limit_s")

    @property
    def mode(self) -> Literal["closed", "open"]:
        """``"closed"`` for a concurrency level, ``"open"`` for an arrival rate."""
        return "closed" if self.concurrency is not None else "open"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (``request`` nested; ``prompt_offset`` and ``prompt_indices``
        only when set, so trials saved before they existed keep their keys)."""
        data = dataclasses.asdict(self)
        if not self.prompt_offset:
            del data["prompt_offset"]
        if self.prompt_indices:
            data["prompt_indices"] = list(self.prompt_indices)
        else:
            del data["prompt_indices"]
        if self.burstiness == 1.0:  # trials saved before these fields keep their keys
            del data["burstiness"]
        if self.arrivals_s:
            data["arrivals_s"] = list(self.arrivals_s)
        else:
            del data["arrivals_s"]
        if not self.full_load:
            del data["full_load"]
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "trial config") -> TrialConfig:
        """Inverse of :meth:`to_dict`; unknown or wrongly typed keys are a BadInputError."""
        if not isinstance(data, dict) or not isinstance(data.get("request", {}), dict):
            raise BadInputError(where, "expected a JSON object with an object 'request'")
        fields = dict(data)
        try:
            fields["request"] = RequestOptions(**fields.get("request", {}))
            for name in ("prompt_indices", "arrivals_s"):
                if isinstance(fields.get(name), list):
                    fields[name] = tuple(fields[name])
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
