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
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from spectool.engine.config import (
    METHODS,
    EngineBusyError,
    EngineConfig,
    resolve_device,
    scheduled_draft_len,
)
from spectool.engine.load import load_model, resolve_dtype
from spectool.engine.methods_held import MethodSwitching, build_proposers, check_methods
from spectool.engine.model import Transformer, pack_rows
from spectool.engine.proposers import Proposer, ProposerContext
from spectool.engine.records import (
    PREFILL_PADDING_SLACK,
    IterationStats,
    TokenEvent,
    _DecodeCounts,
    _Emit,
    _Request,
    prefill_groups,
)
from spectool.engine.sampling import RowSampling, SamplingParams, make_generator, sample_rows
from spectool.engine.speculative import verify_batch
from spectool.engine.tokenizer import Tokenizer
from spectool.errors import BadInputError

__all__ = [
    "Engine",
    "EngineBusyError",
    "EngineConfig",
    "IterationStats",
    "SamplingParams",
    "TokenEvent",
    "scheduled_draft_len",
]
# Also importable from here: METHODS ("none" + the proposer registry), prefill grouping.
_REEXPORTED = (METHODS, PREFILL_PADDING_SLACK, prefill_groups)


# Iteration records kept until drained (TensorRT-LLM's max_stats_len default).
MAX_STATS_RECORDS = 1000


class Engine(MethodSwitching):
    """Serve requests for one target checkpoint, optionally speculating with a drafter.

    ``target_path`` / ``drafter_path``: Hugging Face folders (config.json, safetensors,
    tokenizer.json). ``tokenizer`` and ``model_name`` (the target folder's name) are public.
    """

    def __init__(
        self,
        target_path: Path,
        drafter_path: Path | None = None,
        config: EngineConfig = EngineConfig(),  # noqa: B008 (frozen, safe to share)
        alternatives: Mapping[str, Path | None] | None = None,
    ) -> None:
        target_path = Path(target_path)
        methods: dict[str, Path | None] = {config.method: drafter_path, **(alternatives or {})}
        check_methods(methods)
        self.config = config
        self.device = resolve_device(config.device)
        self._cuda = self.device.type == "cuda"
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
        # One proposer per method: the configured one, and the alternatives a server that
        # switches methods in place holds beside it (tune compares methods on one server).
        self._proposers: dict[str, Proposer] = build_proposers(
            methods,
            lambda path: ProposerContext(
                target=self.target,
                target_path=target_path,
                tokenizer=self.tokenizer,
                checkpoint=Path(path) if path is not None else None,
                config=config,
                device=self.device,
                dtype=dtype,
                max_batch_size=config.max_batch_size,
                max_seq_len=self.max_seq_len,
            ),
        )
        for proposer in self._proposers.values():
            self.max_seq_len = min(self.max_seq_len, proposer.max_seq_len)
        self._cache = self.target.new_cache(config.max_batch_size, self.max_seq_len)
        self._use(config.method)
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
        if self._cuda:
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
            if self._proposer is not None and request.proposer_slot:
                self._proposer.release(request.slot)
            request.slot = -1

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
                self._proposer.allocate(request.slot)  # the target's slot number
                request.proposer_slot = True
        for group in prefill_groups([len(r.tokens) for r in admitted]):
            requests = [admitted[i] for i in group]
            prompts = [r.tokens for r in requests]
            tokens, positions = pack_rows(prompts, [0] * len(prompts))
            select = torch.tensor([[len(p) - 1] for p in prompts], dtype=torch.long)
            slots = torch.tensor([r.slot for r in requests], dtype=torch.long)
            capture = self._hidden_layers if drafting else ()
            out = self.target(
                tokens.to(self.device),
                positions.to(self.device),
                self._cache,
                slots.to(self.device),
                select.to(self.device),
                hidden_layers=capture,
            )
            logits, hidden = out if capture else (out, None)  # [B, 1, V], [B, T, C]
            for request in requests:
                self._cache.set_length(request.slot, len(request.tokens))
            if drafting:
                assert self._proposer is not None
                self._proposer.prefill([r.slot for r in requests], prompts, hidden)
            rows = [r.row_sampling() for r in requests]
            firsts = sample_rows(logits, rows)
            for request, token in zip(requests, firsts, strict=True):
                emit = emits.setdefault(request.request_id, _Emit())
                request.append([token], emit, self.max_seq_len)

    def _propose(
        self, batch: list[_Request], budgets: list[int], rows: list[RowSampling]
    ) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """Drafts per request (at most its budget) and, for model drafts, q per request."""
        drafts: list[list[int]] = [[] for _ in batch]
        q_rows: list[torch.Tensor | None] = [None] * len(batch)
        chosen = [b for b, budget in enumerate(budgets) if budget > 0]
        if not chosen or self._proposer is None:
            return drafts, q_rows
        proposed, q = self._proposer.propose(
            [batch[b].slot for b in chosen],
            [batch[b].tokens for b in chosen],
            [budgets[b] for b in chosen],
            [rows[b] for b in chosen],
        )
        for i, b in enumerate(chosen):
            drafts[b] = proposed[i][: budgets[b]]
            if q is not None:
                q_rows[b] = q[i, : len(drafts[b])]
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
        rows = [r.row_sampling() for r in batch]
        budgets = [r.draft_budget(draft_len, self.max_seq_len) for r in batch]
        drafts, q_rows = self._propose(batch, budgets, rows)
        self._sync()
        counts.draft_ms = (time.perf_counter() - t_draft) * 1e3

        t_verify = time.perf_counter()
        tokens, positions = pack_rows(
            [[r.tokens[-1], *draft] for r, draft in zip(batch, drafts, strict=True)],
            [len(r.tokens) - 1 for r in batch],
        )
        slots = torch.tensor([r.slot for r in batch], dtype=torch.long)
        capture = self._hidden_layers if any(r.proposer_slot for r in batch) else ()
        out = self.target(
            tokens.to(self.device),
            positions.to(self.device),
            self._cache,
            slots.to(self.device),
            hidden_layers=capture,
        )
        logits, hidden = out if capture else (out, None)  # [B, 1 + kmax, V], [B, 1 + kmax, C]
        for request, draft in zip(batch, drafts, strict=True):
            self._cache.set_length(request.slot, len(request.tokens) + len(draft))
        self._sync()
        counts.verify_ms = (time.perf_counter() - t_verify) * 1e3

        t_coord = time.perf_counter()
        verdicts = verify_batch(logits, drafts, q_rows, rows)
        for b, request in enumerate(batch):
            verdict = verdicts[b]
            num_before = len(request.tokens)
            k = len(drafts[b])
            counts.record(request, k, verdict.num_accepted, accepted_per_pos, drafted_per_pos)
            # The cache holds the context and all k drafts: drop the rejected ones (no copy).
            self._cache.rollback(request.slot, num_before + verdict.num_accepted)
            if self._proposer is not None and request.proposer_slot:
                kept = hidden[b, : verdict.num_accepted + 1] if hidden is not None else None
                self._proposer.commit(request.slot, num_before + verdict.num_accepted, kept)
            emit = emits.setdefault(request.request_id, _Emit())
            request.append(verdict.token_ids, emit, self.max_seq_len)
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
