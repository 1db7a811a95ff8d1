"""Continuous-batching inference engine with speculative decoding: the API the server drives.

One :meth:`Engine.step` is one iteration: admit queued requests into free KV-cache slots and
prefill them (a timed phase of its own), then run one decode step for the whole running batch:
draft k tokens per request, verify all of them with a single target forward over k + 1
positions, keep what verification accepts and roll the caches back past the rest. Baseline
decoding (``method="none"``) is the same step with k = 0.

The draft length k follows TensorRT-LLM's ``draft_len_schedule`` semantics (see
:func:`scheduled_draft_len`). Every iteration leaves an :class:`IterationStats` record (phase
times from ``time.perf_counter``, drafted/accepted counts per position), drained like
TensorRT-LLM's ``/metrics``.

Threading: one thread calls :meth:`Engine.step` (and :meth:`Engine.generate`); any thread may
call :meth:`Engine.add_request`, :meth:`Engine.abort`, :meth:`Engine.has_work` and
:meth:`Engine.drain_stats`, which only touch lock-protected queues.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from spectool.engine.load import DTYPES, load_model, resolve_dtype
from spectool.engine.model import Transformer, pack_rows
from spectool.engine.sampling import (
    RowSampling,
    SamplingParams,
    argmax_tokens,
    make_generator,
    process_logits,
    sample,
)
from spectool.engine.speculative import (
    DraftModelProposer,
    Verdict,
    propose_ngram,
    verify_greedy,
    verify_sampled,
)
from spectool.engine.tokenizer import Tokenizer
from spectool.errors import BadInputError, CheckpointError, ConfigError

__all__ = [
    "Engine",
    "EngineBusyError",
    "EngineConfig",
    "IterationStats",
    "SamplingParams",
    "TokenEvent",
    "scheduled_draft_len",
]

METHODS: tuple[str, ...] = ("none", "draft_model", "ngram")


class EngineBusyError(BadInputError):
    """The engine cannot do this while requests are queued or running (e.g. switch its draft
    length): retry once they have finished."""


# Iteration records kept until drained (TensorRT-LLM's max_stats_len default).
MAX_STATS_RECORDS = 1000


@dataclass(frozen=True)
class EngineConfig:
    """How the engine decodes; validated on construction (:class:`ConfigError`).

    ``method``: ``"none"`` (plain decoding), ``"draft_model"`` (a standalone drafter checkpoint)
    or ``"ngram"`` (prompt lookup, up to ``ngram_max_matching`` tokens matched).
    ``max_draft_len``: k at small batch sizes. ``draft_len_schedule``: batch size -> k, keys are
    upper bounds (TensorRT-LLM semantics); the smallest key must map to ``max_draft_len``.
    ``max_concurrency``: speculation off above this batch size (same as
    ``{max_concurrency: max_draft_len}``; exclusive with the schedule). ``max_batch_size``:
    requests decoded together (more wait in a queue). ``max_seq_len``: prompt + output tokens
    per request (capped at the models' ``max_position_embeddings``). ``device``: ``"cpu"``,
    ``"cuda"``, ``"cuda:N"`` or ``"auto"``. ``dtype``: ``float32``, ``float64``, ``bfloat16``
    or ``float16``. ``pack_fp16_weights``: on CPU in float32, weights that float16 holds exactly
    (float16 checkpoints) also get a float16 copy for fbgemm's kernel, which multiplies in float32
    (see :class:`~spectool.engine.model.Projection`); False keeps every product on torch.mm.
    """

    method: str = "none"
    max_draft_len: int = 4
    draft_len_schedule: dict[int, int] | None = None
    max_concurrency: int | None = None
    ngram_max_matching: int = 3
    max_batch_size: int = 32
    max_seq_len: int = 1024
    device: str = "cpu"
    dtype: str = "float32"
    pack_fp16_weights: bool = True

    def __post_init__(self) -> None:
        where = "engine config"
        if self.method not in METHODS:
            raise ConfigError(
                where, f"method must be one of {', '.join(METHODS)}, got {self.method!r}"
            )
        if self.max_draft_len < 0 or (self.method != "none" and self.max_draft_len < 1):
            raise ConfigError(where, f"max_draft_len must be >= 1, got {self.max_draft_len}")
        if self.max_concurrency is not None and self.draft_len_schedule is not None:
            raise ConfigError(
                where, "max_concurrency and draft_len_schedule are mutually exclusive"
            )
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ConfigError(where, f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.draft_len_schedule is not None:
            schedule = self.draft_len_schedule
            if not schedule:
                raise ConfigError(where, "draft_len_schedule is empty")
            for batch_size, draft_len in schedule.items():
                if batch_size < 1:
                    raise ConfigError(
                        where, f"draft_len_schedule keys must be >= 1, got {batch_size}"
                    )
                if not 0 <= draft_len <= self.max_draft_len:
                    raise ConfigError(
                        where,
                        f"draft_len_schedule[{batch_size}] = {draft_len} is outside "
                        f"0..max_draft_len ({self.max_draft_len})",
                    )
            smallest = min(schedule)
            if schedule[smallest] != self.max_draft_len:
                raise ConfigError(
                    where,
                    f"draft_len_schedule[{smallest}] (the smallest key) must equal max_draft_len "
                    f"{self.max_draft_len}, got {schedule[smallest]}",
                )
        if self.ngram_max_matching < 1:
            raise ConfigError(
                where, f"ngram_max_matching must be >= 1, got {self.ngram_max_matching}"
            )
        if self.max_batch_size < 1:
            raise ConfigError(where, f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_seq_len < 2:
            raise ConfigError(where, f"max_seq_len must be >= 2, got {self.max_seq_len}")
        if self.dtype not in DTYPES:
            raise ConfigError(
                where, f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}"
            )


@dataclass(frozen=True)
class TokenEvent:
    """New tokens of one request from one :meth:`Engine.step` (at most one event per request).

    ``finish_reason``: ``"stop"`` (an end-of-sequence or stop id, included in ``token_ids``),
    ``"length"`` (``max_tokens`` or ``max_seq_len`` reached) or ``"abort"``; None while running.
    ``spec``: on a speculating engine's last event of a request, its speculation in vLLM's
    per-request ``speculative_decoding`` shape (what AIPerf reads; :meth:`_Request.spec_stats`).
    """

    request_id: int
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    spec: dict[str, object] | None = None


@dataclass(frozen=True)
class IterationStats:
    """One engine iteration, shaped after TensorRT-LLM's iteration stats (snake_case).

    Times in milliseconds: ``prefill_ms`` (admission + prefill of new requests), ``draft_ms``
    (proposer), ``verify_ms`` (the target forward), ``coord_ms`` (acceptance + bookkeeping);
    ``iter_latency_ms`` covers the whole step. ``num_active_requests``: requests in the batch
    this iteration; ``num_queued_requests``: still waiting after admission. ``max_num_tokens``:
    target KV-cache capacity in tokens (max_batch_size x max_seq_len); ``used_num_tokens``:
    tokens held in it after the iteration. ``draft_len``: scheduled k for this batch size;
    ``accepted_per_pos[i]`` / ``drafted_per_pos[i]``: requests whose draft at position i was
    accepted / proposed (length = max_draft_len, or the draft length set by
    :meth:`Engine.set_draft_len`; empty for ``method="none"``). ``num_decoded_requests``: requests
    in this iteration's decode step (the new ones, prefilled in it, decode from the next one);
    ``num_prompt_tokens``: prompt tokens prefilled in it.
    """

    timestamp: float
    iter: int
    iter_latency_ms: float
    num_active_requests: int
    num_queued_requests: int
    num_new_active_requests: int
    num_completed_requests: int
    max_batch_size: int
    max_num_tokens: int
    used_num_tokens: int
    prefill_ms: float
    draft_ms: float
    verify_ms: float
    coord_ms: float
    draft_len: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_requests_with_draft_tokens: int
    accepted_per_pos: tuple[int, ...]
    drafted_per_pos: tuple[int, ...]
    num_decoded_requests: int = 0
    num_prompt_tokens: int = 0


def scheduled_draft_len(
    batch_size: int,
    max_draft_len: int,
    draft_len_schedule: dict[int, int] | None = None,
    max_concurrency: int | None = None,
) -> int:
    """Draft length k for a batch of ``batch_size`` running requests.

    TensorRT-LLM semantics: schedule keys are upper bounds, so k = ``schedule[key]`` for the
    smallest key >= batch_size, and 0 above the largest key. ``max_concurrency`` = m is the
    schedule ``{m: max_draft_len}``. Neither set: always ``max_draft_len``.
    Example: ``{4: 4, 8: 2, 32: 1}`` gives 4 for 1-4 requests, 2 for 5-8, 1 for 9-32, 0 above.
    """
    if max_draft_len <= 0 or batch_size < 1:
        return 0
    schedule = draft_len_schedule
    if schedule is None and max_concurrency is not None:
        schedule = {max_concurrency: max_draft_len}
    if schedule is None:
        return max_draft_len
    for key in sorted(schedule):
        if batch_size <= key:
            return schedule[key]
    return 0


PREFILL_PADDING_SLACK = 1.25  # a prefill group computes at most 25% padding


def prefill_groups(lengths: Sequence[int]) -> list[list[int]]:
    """Indices of prompts grouped for prefill: by ascending length, a group closes before the
    prompt that would make its padded size (count x longest) exceed
    :data:`PREFILL_PADDING_SLACK` times its real size. Short prompts of similar length still
    share one forward (a few rows make a slow matrix product on a CPU); a long one does not
    make every short one pay its length."""
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        longest = lengths[i]
        if current and (len(current) + 1) * longest > PREFILL_PADDING_SLACK * (total + longest):
            groups.append(current)
            current, total = [], 0
        current.append(i)
        total += longest
    if current:
        groups.append(current)
    return groups


@dataclass
class _Request:
    """Mutable state of one request inside the engine (owned by the stepping thread)."""

    request_id: int
    params: SamplingParams
    generator: torch.Generator | None
    stop_ids: frozenset[int]
    tokens: list[int]  # prompt + output; the last one is not yet in the target cache
    prompt_len: int
    slot: int = -1
    drafter_slot: bool = False  # the drafter's cache holds this request (speculation was on)
    accepted_per_step: list[int] = field(default_factory=list)  # steps that drafted
    drafted: int = 0

    def spec_stats(self, max_draft_len: int) -> dict[str, object]:
        """This request's speculation as vLLM reports it per request (``metrics.
        speculative_decoding``, vllm-project/vllm#48915, read by AIPerf 0.13): steps that
        drafted, drafts proposed and accepted, and a histogram of accepted drafts per step
        (index j: steps that accepted exactly j, ``max_draft_len + 1`` buckets)."""
        steps = len(self.accepted_per_step)
        accepted = sum(self.accepted_per_step)
        histogram = [0] * (max_draft_len + 1)
        for j in self.accepted_per_step:
            histogram[j] += 1
        return {
            "num_spec_steps": steps,
            "num_draft_tokens": self.drafted,
            "num_accepted_draft_tokens": accepted,
            "num_spec_tokens": max_draft_len,
            "acceptance_histogram": histogram,
            "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": accepted / self.drafted if self.drafted else 0.0,
        }

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.prompt_len


@dataclass
class _Emit:
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class _DecodeCounts:
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    coord_ms: float = 0.0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_requests_with_draft_tokens: int = 0


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ConfigError("engine config", f"unknown device {name!r}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("engine config", f"device {name!r} requested but CUDA is not available")
    return device


class Engine:
    """Serve requests for one target checkpoint, optionally speculating with a drafter.

    ``target_path`` / ``drafter_path``: Hugging Face folders (config.json, safetensors,
    tokenizer.json). ``tokenizer`` and ``model_name`` (the target folder's name) are public.
    """

    def __init__(
        self,
        target_path: Path,
        drafter_path: Path | None = None,
        config: EngineConfig = EngineConfig(),  # noqa: B008 (frozen, safe to share)
    ) -> None:
        target_path = Path(target_path)
        if config.method == "draft_model" and drafter_path is None:
            raise ConfigError("engine config", "method 'draft_model' needs a drafter checkpoint")
        if config.method != "draft_model" and drafter_path is not None:
            raise ConfigError(
                "engine config",
                f"a drafter checkpoint is only used with method 'draft_model', "
                f"not {config.method!r}",
            )
        self.config = config
        self.device = _resolve_device(config.device)
        dtype = resolve_dtype(config.dtype)
        self.model_name = target_path.resolve().name
        self.target: Transformer = load_model(
            target_path,
            device=self.device,
            dtype=dtype,
            max_seq_len=config.max_seq_len,
            pack_fp16=config.pack_fp16_weights,
        )
        self.tokenizer = Tokenizer.from_dir(target_path)
        self.vocab_size = self.target.args.vocab_size
        self.max_seq_len = self.target.max_seq_len
        self.max_draft_len = 0 if config.method == "none" else config.max_draft_len
        self._proposer: DraftModelProposer | None = None
        self.drafter: Transformer | None = None
        drafter: Transformer | None = None
        if drafter_path is not None:
            drafter_path = Path(drafter_path)
            drafter = load_model(
                drafter_path,
                device=self.device,
                dtype=dtype,
                max_seq_len=config.max_seq_len,
                pack_fp16=config.pack_fp16_weights,
            )
            self._check_drafter_vocab(target_path, drafter_path)
            self.max_seq_len = min(self.max_seq_len, drafter.max_seq_len)
        self.drafter = drafter
        self._cache = self.target.new_cache(config.max_batch_size, self.max_seq_len)
        if drafter is not None:
            self._proposer = DraftModelProposer(
                drafter, drafter.new_cache(config.max_batch_size, self.max_seq_len), self.vocab_size
            )
        self._lock = threading.Lock()
        self._queue: deque[_Request] = deque()
        self._aborts: set[int] = set()
        self._running: dict[int, _Request] = {}
        self._stats: deque[IterationStats] = deque(maxlen=MAX_STATS_RECORDS)
        self._next_id = 0
        self._iter = 0
        # set_draft_len(): a fixed draft length replacing the configured one and its schedule
        self._fixed_draft_len: int | None = None
        # step() hands the first tokens of newly prefilled requests to this callback before it
        # decodes the running batch, so a stream's first chunk is the prefill token alone
        self.on_prefill: Callable[[list[TokenEvent]], None] | None = None

    def _check_drafter_vocab(self, target_path: Path, drafter_path: Path) -> None:
        """Refuse a drafter whose tokenizer maps tokens to different ids than the target's."""
        if not (drafter_path / "tokenizer.json").is_file():
            return
        drafter_tokenizer = Tokenizer.from_dir(drafter_path)
        if drafter_tokenizer.get_vocab() != self.tokenizer.get_vocab():
            raise CheckpointError(
                drafter_path, f"tokenizer differs from the target's ({target_path})"
            )

    # -- requests (any thread) ---------------------------------------------------------------

    def add_request(self, prompt_ids: list[int], params: SamplingParams) -> int:
        """Queue a request; returns its id. Bad prompts raise :class:`BadInputError`."""
        if not isinstance(params, SamplingParams):
            raise BadInputError("sampling params", "expected SamplingParams")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise BadInputError("prompt", "is empty")
        if len(prompt) >= self.max_seq_len:
            raise BadInputError(
                "prompt",
                f"{len(prompt)} tokens leave no room to generate within max_seq_len "
                f"{self.max_seq_len}",
            )
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise BadInputError("prompt", f"token id {bad[0]} outside 0..{self.vocab_size - 1}")
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids.update(self.tokenizer.eos_token_ids)
        generator = None if params.greedy else make_generator(params.seed, self.device)
        with self._lock:
            request_id = self._next_id
            self._next_id += 1
            self._queue.append(
                _Request(
                    request_id=request_id,
                    params=params,
                    generator=generator,
                    stop_ids=frozenset(stop_ids),
                    tokens=prompt,
                    prompt_len=len(prompt),
                )
            )
        return request_id

    def abort(self, request_id: int) -> None:
        """Stop a queued or running request at the next step (it gets an ``"abort"`` event)."""
        with self._lock:
            self._aborts.add(request_id)

    def has_work(self) -> bool:
        """True while requests are queued, running, or waiting to be aborted."""
        with self._lock:
            return bool(self._queue or self._running or self._aborts)

    def drain_stats(self) -> list[IterationStats]:
        """Iteration records since the last call (each is returned once)."""
        with self._lock:
            records = list(self._stats)
            self._stats.clear()
        return records

    @property
    def draft_len(self) -> int | None:
        """The fixed draft length set by :meth:`set_draft_len` (None: the configured one)."""
        return self._fixed_draft_len

    def set_draft_len(self, k: int | None) -> None:
        """Decode every later step at draft length ``k`` (0: no speculation), or go back to
        the configured draft length and schedule (``None``). Only while idle.

        ``k`` may be anything from 0 to the configured ``max_draft_len``; the proposer and its
        cache stay loaded. With ``k = 0`` the drafter does no work at all (no prefill, no
        drafting), so the step is the baseline's step on the same engine: this is how ``tune``
        pairs speculative and baseline measurements in one server without a restart. Raises
        :class:`BadInputError` for an out-of-range ``k``, :class:`EngineBusyError` while requests are queued or running
        (the drafter's cache must hold either every request or none).
        """
        if k is not None and not 0 <= k <= self.max_draft_len:
            raise BadInputError(
                "draft length",
                f"{k} is outside 0..{self.max_draft_len} (the engine's max_draft_len)",
            )
        with self._lock:
            if self._queue or self._running:
                raise EngineBusyError(
                    "draft length",
                    f"cannot change while {len(self._queue) + len(self._running)} requests run",
                )
            self._fixed_draft_len = k

    def _speculating(self) -> bool:
        return self.max_draft_len > 0 and self._fixed_draft_len != 0

    # -- stepping (one thread) ---------------------------------------------------------------

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self) -> list[TokenEvent]:
        """One iteration: aborts, admission + prefill, one decode step for the running batch."""
        t_start = time.perf_counter()
        emits: dict[int, _Emit] = {}
        with self._lock:
            aborts, self._aborts = self._aborts, set()
            for request_id in aborts:
                request = self._running.pop(request_id, None)
                if request is not None:
                    self._release(request)
                    emits[request_id] = _Emit(finish_reason="abort")
            if aborts:
                kept = [r for r in self._queue if r.request_id not in aborts]
                for r in self._queue:
                    if r.request_id in aborts:
                        emits[r.request_id] = _Emit(finish_reason="abort")
                self._queue = deque(kept)
            admitted: list[_Request] = []
            while self._queue and len(self._running) + len(admitted) < self.config.max_batch_size:
                admitted.append(self._queue.popleft())
            for request in admitted:
                self._running[request.request_id] = request
            num_queued = len(self._queue)
        num_active = len(self._running)

        t_prefill = time.perf_counter()
        if admitted:
            with torch.inference_mode():
                self._prefill(admitted, emits)
            self._sync()
        prefill_ms = (time.perf_counter() - t_prefill) * 1e3
        # The new requests' first tokens go out now; they join the decode batch next step (as in
        # TensorRT-LLM, where a context request generates from the following iteration on).
        touched = bool(emits)  # prefills or aborts: the iteration is recorded
        new_ids = {r.request_id for r in admitted}
        events = self._events(new_ids, emits)
        finished = sum(e.finished for e in events)
        if events and self.on_prefill is not None:
            self.on_prefill(events)
            events = []
        batch = [
            r
            for r in self._running.values()
            if r.request_id not in new_ids
            and emits.get(r.request_id, _Emit()).finish_reason is None
        ]
        if self._fixed_draft_len is not None:
            draft_len = self._fixed_draft_len if batch else 0
            positions = self._fixed_draft_len
        else:
            draft_len = scheduled_draft_len(
                len(batch),
                self.max_draft_len,
                self.config.draft_len_schedule,
                self.config.max_concurrency,
            )
            positions = self.max_draft_len
        accepted_per_pos = [0] * positions
        drafted_per_pos = [0] * positions
        counts = _DecodeCounts()
        if batch:
            with torch.inference_mode():
                counts = self._decode(batch, draft_len, emits, accepted_per_pos, drafted_per_pos)
        decoded = self._events(set(emits), emits)  # the batch's, and aborted requests'
        finished += sum(e.finished for e in decoded)
        events += decoded
        if touched or batch:
            stats = IterationStats(
                timestamp=time.time(),
                iter=self._iter,
                iter_latency_ms=(time.perf_counter() - t_start) * 1e3,
                num_active_requests=num_active,
                num_queued_requests=num_queued,
                num_new_active_requests=len(admitted),
                num_completed_requests=finished,
                max_batch_size=self.config.max_batch_size,
                max_num_tokens=self.config.max_batch_size * self.max_seq_len,
                used_num_tokens=self._cache.num_used_tokens(),
                prefill_ms=prefill_ms,
                draft_ms=counts.draft_ms,
                verify_ms=counts.verify_ms,
                coord_ms=counts.coord_ms,
                draft_len=draft_len,
                num_draft_tokens=counts.num_draft_tokens,
                num_accepted_tokens=counts.num_accepted_tokens,
                num_requests_with_draft_tokens=counts.num_requests_with_draft_tokens,
                accepted_per_pos=tuple(accepted_per_pos),
                drafted_per_pos=tuple(drafted_per_pos),
                num_decoded_requests=len(batch),
                num_prompt_tokens=sum(r.prompt_len for r in admitted),
            )
            with self._lock:
                self._stats.append(stats)
            self._iter += 1
        return events

    def _events(self, request_ids: set[int], emits: dict[int, _Emit]) -> list[TokenEvent]:
        """Token events of ``request_ids`` from ``emits`` (removed from it); finished requests
        leave the running set and free their cache slots."""
        events: list[TokenEvent] = []
        for request_id in [i for i in emits if i in request_ids]:
            emit = emits.pop(request_id)
            spec = None
            if emit.finish_reason is not None:
                with self._lock:
                    request = self._running.pop(request_id, None)
                if request is not None:
                    self._release(request)
                    if self.max_draft_len > 0:
                        spec = request.spec_stats(self.max_draft_len)
            events.append(
                TokenEvent(
                    request_id=request_id,
                    token_ids=tuple(emit.tokens),
                    finished=emit.finish_reason is not None,
                    finish_reason=emit.finish_reason,
                    spec=spec,
                )
            )
        return events

    def _release(self, request: _Request) -> None:
        if request.slot >= 0:
            self._cache.free(request.slot)
            if self._proposer is not None and request.drafter_slot:
                self._proposer.cache.free(request.slot)
            request.slot = -1

    def _row_sampling(self, request: _Request) -> RowSampling:
        left = request.params.min_tokens - request.num_output
        return RowSampling(
            params=request.params,
            generator=request.generator,
            suppress_ids=tuple(sorted(request.stop_ids)) if left > 0 else (),
            suppress_before=max(left, 0),
        )

    def _append(self, request: _Request, new_tokens: Sequence[int], emit: _Emit) -> None:
        """Add tokens to a request, stopping at a stop id, ``max_tokens`` or ``max_seq_len``."""
        for token in new_tokens:
            request.tokens.append(int(token))
            emit.tokens.append(int(token))
            if token in request.stop_ids and request.num_output > request.params.min_tokens:
                emit.finish_reason = "stop"
            elif request.num_output >= request.params.max_tokens:
                emit.finish_reason = "length"
            elif len(request.tokens) >= self.max_seq_len:
                emit.finish_reason = "length"
            if emit.finish_reason is not None:
                return

    def _prefill(self, admitted: list[_Request], emits: dict[int, _Emit]) -> None:
        """Write prompts into fresh slots and sample each request's first token.

        Prompts are prefilled in groups of similar length (:func:`prefill_groups`): one padded
        batch of a 100- and an 850-token prompt would compute 1700 positions (and their
        attention) for 950 real ones.
        """
        drafting = self._proposer is not None and self._speculating()
        for request in admitted:
            request.slot = self._cache.allocate()
            if drafting:
                assert self._proposer is not None
                self._proposer.cache.allocate(request.slot)  # the same slot in both caches
                request.drafter_slot = True
        for group in prefill_groups([len(r.tokens) for r in admitted]):
            requests = [admitted[i] for i in group]
            prompts = [r.tokens for r in requests]
            tokens, positions = pack_rows(prompts, [0] * len(prompts))
            select = torch.tensor([[len(p) - 1] for p in prompts], dtype=torch.long)
            slots = torch.tensor([r.slot for r in requests], dtype=torch.long)
            logits = self.target(
                tokens.to(self.device),
                positions.to(self.device),
                self._cache,
                slots.to(self.device),
                select.to(self.device),
            )  # [B, 1, V]
            for request in requests:
                self._cache.set_length(request.slot, len(request.tokens))
            if drafting:
                assert self._proposer is not None
                self._proposer.prefill([r.slot for r in requests], prompts)
            rows = [self._row_sampling(r) for r in requests]
            firsts = self._sample_rows(logits, rows)
            for request, token in zip(requests, firsts, strict=True):
                emit = emits.setdefault(request.request_id, _Emit())
                self._append(request, [token], emit)

    def _sample_rows(self, logits: torch.Tensor, rows: list[RowSampling]) -> list[int]:
        """One token per row from logits ``[B, 1, V]``."""
        if all(r.greedy for r in rows):
            return argmax_tokens(logits, rows)[:, 0].tolist()
        probs = process_logits(logits, rows)[:, 0]  # [B, V]
        return [
            int(probs[b].argmax()) if row.greedy else sample(probs[b], row.generator)
            for b, row in enumerate(rows)
        ]

    def _propose(
        self, batch: list[_Request], budgets: list[int], rows: list[RowSampling]
    ) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """Drafts per request (at most its budget) and, for model drafts, q per request."""
        drafts: list[list[int]] = [[] for _ in batch]
        q_rows: list[torch.Tensor | None] = [None] * len(batch)
        chosen = [b for b, budget in enumerate(budgets) if budget > 0]
        if not chosen:
            return drafts, q_rows
        if self.config.method == "ngram":
            for b in chosen:
                drafts[b] = propose_ngram(
                    batch[b].tokens, budgets[b], self.config.ngram_max_matching
                )
        elif self._proposer is not None:
            proposed, q = self._proposer.propose(
                [batch[b].slot for b in chosen],
                [batch[b].tokens for b in chosen],
                [budgets[b] for b in chosen],
                [rows[b] for b in chosen],
            )
            for i, b in enumerate(chosen):
                drafts[b] = proposed[i]
                if q is not None:
                    q_rows[b] = q[i, : len(proposed[i])]
        return drafts, q_rows

    def _decode(
        self,
        batch: list[_Request],
        draft_len: int,
        emits: dict[int, _Emit],
        accepted_per_pos: list[int],
        drafted_per_pos: list[int],
    ) -> _DecodeCounts:
        """Draft, verify in one target forward, accept, roll back: one step for ``batch``."""
        counts = _DecodeCounts()
        t_draft = time.perf_counter()
        rows = [self._row_sampling(r) for r in batch]
        budgets = [
            max(
                0,
                min(
                    draft_len,
                    r.params.max_tokens - r.num_output - 1,
                    self.max_seq_len - len(r.tokens),
                ),
            )
            for r in batch
        ]
        drafts, q_rows = self._propose(batch, budgets, rows)
        self._sync()
        counts.draft_ms = (time.perf_counter() - t_draft) * 1e3

        t_verify = time.perf_counter()
        tokens, positions = pack_rows(
            [[r.tokens[-1], *draft] for r, draft in zip(batch, drafts, strict=True)],
            [len(r.tokens) - 1 for r in batch],
        )
        slots = torch.tensor([r.slot for r in batch], dtype=torch.long)
        logits = self.target(
            tokens.to(self.device), positions.to(self.device), self._cache, slots.to(self.device)
        )  # [B, 1 + kmax, V]
        for request, draft in zip(batch, drafts, strict=True):
            self._cache.set_length(request.slot, len(request.tokens) + len(draft))
        self._sync()
        counts.verify_ms = (time.perf_counter() - t_verify) * 1e3

        t_coord = time.perf_counter()
        verdicts: list[Verdict | None] = [None] * len(batch)
        greedy = [b for b, row in enumerate(rows) if row.greedy]
        sampled = [b for b, row in enumerate(rows) if not row.greedy]
        if greedy:
            greedy_logits = logits if not sampled else logits[greedy]  # no copy when all greedy
            argmax = argmax_tokens(greedy_logits, [rows[b] for b in greedy]).tolist()
            for i, b in enumerate(greedy):
                verdicts[b] = verify_greedy(drafts[b], argmax[i][: 1 + len(drafts[b])])
        if sampled:
            probs = process_logits(logits[sampled], [rows[b] for b in sampled])  # [Bs, T, V]
            for i, b in enumerate(sampled):
                k = len(drafts[b])
                verdicts[b] = verify_sampled(
                    drafts[b], q_rows[b], probs[i, : k + 1], rows[b].generator
                )
        for b, request in enumerate(batch):
            verdict = verdicts[b]
            assert verdict is not None
            num_before = len(request.tokens)
            k = len(drafts[b])
            if k:
                request.accepted_per_step.append(verdict.num_accepted)
                request.drafted += k
                counts.num_requests_with_draft_tokens += 1
                counts.num_draft_tokens += k
                counts.num_accepted_tokens += verdict.num_accepted
                for pos in range(k):
                    drafted_per_pos[pos] += 1
                for pos in range(verdict.num_accepted):
                    accepted_per_pos[pos] += 1
            # The cache holds the context and all k drafts: drop the rejected ones (no copy).
            self._cache.rollback(request.slot, num_before + verdict.num_accepted)
            if self._proposer is not None and request.drafter_slot:
                self._proposer.commit(request.slot, num_before + verdict.num_accepted)
            emit = emits.setdefault(request.request_id, _Emit())
            self._append(request, verdict.token_ids, emit)
        counts.coord_ms = (time.perf_counter() - t_coord) * 1e3
        return counts

    # -- convenience -------------------------------------------------------------------------

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[list[int]]:
        """Run prompts to completion and return each one's output ids (in prompt order).

        Drives :meth:`step` itself: do not use while another thread is stepping the engine.
        """
        params_list = list(params) if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise BadInputError("sampling params", "one per prompt, or a single one for all")
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params_list, strict=True)]
        outputs: dict[int, list[int]] = {i: [] for i in ids}
        pending = set(ids)
        while pending:
            if not self.has_work():
                raise RuntimeError("engine went idle with requests unfinished")
            for event in self.step():
                if event.request_id in outputs:
                    outputs[event.request_id].extend(event.token_ids)
                    if event.finished:
                        pending.discard(event.request_id)
        return [outputs[i] for i in ids]
