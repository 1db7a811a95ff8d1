"""Drive an :class:`~spectool.engine.engine.Engine` from asyncio: one stepping thread, one queue each.

The engine is synchronous and owned by one thread that calls :meth:`Engine.step` while it has
work and sleeps on an event otherwise. Each step's token events are handed to the event loop in
one ``loop.call_soon_threadsafe`` call and routed to the asyncio queue of their request. Requests
beyond ``max_batch_size`` wait in the engine's own queue. Iteration stats move into a bounded
deque (TensorRT-LLM's ``max_stats_len``, default 1000) that ``/metrics`` drains.

Text is produced on the event loop, per request: an incremental detokenizer turns token ids into
text deltas, and stop strings are searched token by token so that the request ends (and is
aborted in the engine, freeing its slot) at the token that completes a stop string, whatever the
number of tokens one speculative step produced. While stop strings are set, the last
``len(longest stop) - 1`` characters are held back so a streamed delta never shows the start of
a stop string that later completes (vLLM does the same).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from spectool.engine.engine import (
    Engine,
    EngineBusyError,
    IterationStats,
    SamplingParams,
    TokenEvent,
)
from spectool.engine.tokenizer import IncrementalDecoder
from spectool.server.metrics import PrometheusTotals

__all__ = ["AsyncEngine", "Delta", "EngineDeadError", "GenerationRequest", "RequestStream"]

logger = logging.getLogger("spectool.server")

DEFAULT_MAX_STATS_LEN = 1000  # TensorRT-LLM's max_stats_len default
IDLE_WAIT_S = 0.5  # the stepping thread re-checks for work at least this often
HISTORY_LEN = 20_000  # iteration records kept for iterations_after (not drained)


class EngineDeadError(RuntimeError):
    """The stepping thread stopped (engine failure or shutdown); the request cannot go on."""


@dataclass(frozen=True)
class GenerationRequest:
    """One request as the driver runs it: prompt ids, engine sampling, text-level stops."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True


@dataclass(frozen=True)
class Delta:
    """New output of one request: text and the token ids that produced it.

    ``finish_reason``: ``"stop"`` (end-of-sequence or stop id, or a stop string), ``"length"``
    or ``"abort"``; None while the request runs. ``num_output_tokens`` counts every output token
    so far (an end-of-sequence token included, tokens after a stop string excluded).
    """

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    num_output_tokens: int

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestStream:
    """A request's deltas as an async iterator; :meth:`close` aborts it if still running.

    Created by :meth:`AsyncEngine.submit`; lives on the event loop thread.
    """

    def __init__(
        self,
        driver: AsyncEngine,
        request_id: int,
        request: GenerationRequest,
        decoder: IncrementalDecoder,
    ) -> None:
        self._driver = driver
        self.request_id = request_id
        self.request = request
        self.prompt_len = len(request.prompt_ids)
        self._decoder = decoder
        self._queue: asyncio.Queue[TokenEvent | BaseException] = asyncio.Queue()
        self._stops = request.stop
        self._holdback = max((len(s) for s in request.stop), default=1) - 1
        self.token_ids: list[int] = []
        self._text = ""
        self._emitted = 0
        self.finish_reason: str | None = None
        self._engine_done = False  # the engine sent this request's last event
        self.spec_stats: dict[str, object] | None = None  # the request's speculation, at the end
        self._closed = False

    # -- called by the driver on the event loop ------------------------------------------------

    def _put(self, item: TokenEvent | BaseException) -> None:
        self._queue.put_nowait(item)

    # -- consumer side -------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Delta:
        if self.finished or self._closed:
            raise StopAsyncIteration
        while True:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                self.finish_reason = "abort"
                self._engine_done = True  # nothing left to abort
                self.close()
                raise EngineDeadError(f"engine stopped: {item}") from item
            delta = self._process(item)
            if delta is not None:
                return delta

    def close(self) -> None:
        """Stop listening; abort the request in the engine if it has not finished (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._driver._forget(self.request_id, abort=not self._engine_done)

    def _process(self, event: TokenEvent) -> Delta | None:
        """Detokenize an event's tokens, look for stop strings, and build the next delta."""
        start = len(self.token_ids)
        self._engine_done = event.finished
        if event.spec is not None:
            self.spec_stats = event.spec
        stop_at: int | None = None
        if self._stops:
            for token in event.token_ids:
                self.token_ids.append(token)
                stop_at = self._push_text(self._decoder.push((token,)))
                if stop_at is not None:
                    break
        else:
            self.token_ids.extend(event.token_ids)
            self._text += self._decoder.push(event.token_ids)
        if stop_at is None and event.finished:
            stop_at = self._push_text(self._decoder.flush())
        if stop_at is not None:
            self._text = self._text[:stop_at]
            self.finish_reason = "stop"
        elif event.finished:
            self.finish_reason = event.finish_reason or "abort"
        end = len(self._text) if self.finished else max(len(self._text) - self._holdback, 0)
        text = self._text[self._emitted : end] if end > self._emitted else ""
        self._emitted = max(self._emitted, end)
        new_ids = tuple(self.token_ids[start:])
        if self.finished:
            self.close()  # a stop string ends the request early: abort it in the engine
        if not text and not new_ids and not self.finished:
            return None
        return Delta(
            text=text,
            token_ids=new_ids,
            finish_reason=self.finish_reason,
            num_output_tokens=len(self.token_ids),
        )

    def _push_text(self, piece: str) -> int | None:
        """Append decoded text; return where the output ends if a stop string completed."""
        if not piece:
            return None
        search_from = max(len(self._text) - self._holdback, 0)
        self._text += piece
        if not self._stops:
            return None
        best: tuple[int, str] | None = None
        for stop in self._stops:
            index = self._text.find(stop, search_from)
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        if best is None:
            return None
        index, stop = best
        return index + len(stop) if self.request.include_stop_str_in_output else index


class AsyncEngine:
    """Own an :class:`Engine` on a background thread and serve its requests to asyncio code.

    Call :meth:`start` from the event loop that will consume the streams, :meth:`submit` per
    request, :meth:`drain_stats` for ``/metrics`` and :meth:`shutdown` once at the end.
    """

    def __init__(self, engine: Engine, *, max_stats_len: int = DEFAULT_MAX_STATS_LEN) -> None:
        if max_stats_len < 1:
            raise ValueError(f"max_stats_len must be >= 1, got {max_stats_len}")
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = engine.model_name
        self.max_seq_len = engine.max_seq_len
        self.vocab_size = engine.vocab_size
        self.speculative = engine.max_draft_len > 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._stats_lock = threading.Lock()
        self._stats: deque[IterationStats] = deque(maxlen=max_stats_len)
        # The same records, not drained: readers page through them by iteration number
        # (iterations_after), so a /metrics reader elsewhere cannot take tune's samples.
        self._history: deque[IterationStats] = deque(maxlen=HISTORY_LEN)
        self._streams: dict[int, RequestStream] = {}
        self.error: BaseException | None = None
        # Finish reasons of the engine's events (loop thread only): "stop", "length", "abort".
        self.finish_counts: Counter[str] = Counter()
        self.totals = PrometheusTotals()  # since start, for /prometheus/metrics (stats lock)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the stepping thread; events are delivered on ``loop`` (default: the running one)."""
        if self._thread is not None:
            raise RuntimeError("AsyncEngine already started")
        self._loop = loop or asyncio.get_running_loop()
        # first tokens go out as soon as their prefill ends, before the step's decode
        self.engine.on_prefill = lambda events: self._call_soon(self._dispatch, events)
        self._thread = threading.Thread(target=self._run, name="spectool-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """True while the stepping thread runs and has not failed."""
        return self._thread is not None and self._thread.is_alive() and self.error is None

    @property
    def num_unfinished(self) -> int:
        """Requests submitted and not yet finished or closed."""
        return len(self._streams)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the thread after its current step; unfinished streams end with an error."""
        self._stopping.set()
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.warning("engine thread still busy after %.0f s; leaving it", timeout_s)
        stopped = EngineDeadError("server shutting down")
        for stream in list(self._streams.values()):
            stream._put(stopped)

    # -- requests (event loop thread) ----------------------------------------------------------

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Queue a request in the engine; iterate the returned stream for its deltas.

        Raises :class:`~spectool.errors.BadInputError` for prompts the engine refuses (too long,
        token ids outside the vocabulary) and :class:`EngineDeadError` once the engine stopped.
        """
        if not self.alive or self._stopping.is_set():
            raise EngineDeadError("engine is not running")
        request_id = self.engine.add_request(list(request.prompt_ids), request.params)
        decoder = self.tokenizer.incremental_decoder(
            skip_special_tokens=request.skip_special_tokens
        )
        stream = RequestStream(self, request_id, request, decoder)
        self._streams[request_id] = stream
        self._wakeup.set()
        return stream

    def _forget(self, request_id: int, *, abort: bool) -> None:
        self._streams.pop(request_id, None)
        if abort:
            self.engine.abort(request_id)
            self._wakeup.set()

    def _dispatch(self, events: Sequence[TokenEvent]) -> None:
        """Route one step's events to their streams (runs on the event loop)."""
        for event in events:
            if event.finished and event.finish_reason is not None:
                self.finish_counts[event.finish_reason] += 1
            stream = self._streams.get(event.request_id)
            if stream is not None:
                stream._put(event)

    def abort_all(self, message: str, after_s: float = 0.0) -> None:
        """In ``after_s`` seconds, end every request still unfinished with
        :class:`EngineDeadError` (``message``): its client gets an OpenAI error object. Safe to
        call from any thread and from a signal handler."""
        if self._loop is None:
            return
        error = EngineDeadError(message)

        def schedule(_: object) -> None:
            assert self._loop is not None
            self._loop.call_later(after_s, self._fail_all, error)

        self._call_soon(schedule, None)

    def _fail_all(self, error: BaseException) -> None:
        for stream in list(self._streams.values()):
            stream._put(error)

    # -- stats -------------------------------------------------------------------------------

    def drain_stats(self) -> list[IterationStats]:
        """Iteration records since the last call, oldest first (each is returned once)."""
        with self._stats_lock:
            records = list(self._stats)
            self._stats.clear()
        return records

    def iterations_after(self, after: int) -> list[IterationStats]:
        """Iteration records numbered above ``after``, oldest first; nothing is drained."""
        with self._stats_lock:
            return [r for r in self._history if r.iter > after]

    def prometheus(self, model_name: str) -> str:
        """Totals since start in Prometheus' text format (never drained)."""
        from spectool.server.metrics import prometheus_text

        with self._stats_lock:
            return prometheus_text(self.totals, model_name)

    def last_iteration(self) -> int:
        """The newest recorded iteration's number (-1 before the first)."""
        with self._stats_lock:
            return self._history[-1].iter if self._history else -1

    def set_draft_len(self, k: int | None, method: str | None = None) -> None:
        """Fix the engine's draft length (0: speculation off), or None for the configured
        one, and with ``method`` the method drafting (one the engine holds); only while no
        request is in flight (see :meth:`Engine.set_draft_len`, :meth:`Engine.set_method`)."""
        if self._streams:
            raise EngineBusyError(
                "draft length", f"cannot change while {len(self._streams)} requests run"
            )
        if method is not None:
            self.engine.set_method(method)
        self.engine.set_draft_len(k)

    # -- the stepping thread -------------------------------------------------------------------

    def _run(self) -> None:
        assert self._loop is not None
        engine = self.engine
        while not self._stopping.is_set():
            self._wakeup.clear()
            if not engine.has_work():
                self._wakeup.wait(IDLE_WAIT_S)
                continue
            try:
                events = engine.step()
            except BaseException as exc:  # the engine's state is unknown now: stop serving
                logger.exception("engine step failed; no further requests will be served")
                self.error = exc
                self._call_soon(self._fail_all, exc)
                return
            records = engine.drain_stats()
            if records:
                with self._stats_lock:
                    self._stats.extend(records)
                    self._history.extend(records)
                    for record in records:
                        self.totals.add(record)
            if events:
                self._call_soon(self._dispatch, events)

    def _call_soon(self, callback: object, arg: object) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, arg)  # type: ignore[arg-type]
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._stopping.set()
