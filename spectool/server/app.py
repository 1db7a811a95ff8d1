"""The OpenAI-compatible FastAPI app over spectool's embedded engine.

Endpoints: ``GET /health`` (503 while the model loads, 200 after; trtllm-serve's contract),
``GET /version``, ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(streamed as server-sent events or not), ``GET /metrics`` (TensorRT-LLM's iteration-stats
JSON, drained on read: see :mod:`spectool.server.metrics`) and ``GET /prometheus/metrics``
(totals as Prometheus text, never drained). spectool's own: ``GET|POST /spectool/draft_len``
(the draft length switched in place, for ``tune``'s paired blocks) and
``GET /spectool/iterations?after=N`` (iteration stats paged by number, not drained).

The model loads on a background thread once the app starts, so the socket answers ``/health``
during the load. Every malformed request gets a 4xx JSON body in OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}``; a client that disconnects has its request
aborted in the engine, freeing its batch slot.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

import spectool
from spectool.engine.engine import Engine, EngineBusyError, SamplingParams
from spectool.errors import BadInputError
from spectool.server.driver import (
    AsyncEngine,
    Delta,
    EngineDeadError,
    GenerationRequest,
    RequestStream,
)
from spectool.server.metrics import PROMETHEUS_PATH, iteration_stats_json
from spectool.server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    Usage,
    chat_completion_id,
    completion_id,
)

__all__ = ["ENGINE_NAME", "EngineFactory", "create_app"]

logger = logging.getLogger("spectool.server")

ENGINE_NAME = "spectool-torch"
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_TEMPERATURE = 1.0  # OpenAI's (and trtllm-serve's) default
# Smaller positive temperatures are raised to this (as vLLM does): logits / 1e-40 overflow.
MIN_POSITIVE_TEMPERATURE = 1e-2

EngineFactory = Callable[[], Engine]


class APIError(Exception):
    """An HTTP error answered in OpenAI's shape (status, type, message, param, code)."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type_
        self.param = param
        self.code = code


@dataclass
class ServerState:
    """What the routes share: the served name and, once loaded, the driven engine."""

    model_name: str
    max_stats_len: int
    driver: AsyncEngine | None = None
    load_error: BaseException | None = None
    load_s: float | None = None
    closing: bool = False
    # Called on the event loop when the model fails to load (the runner stops the server).
    on_load_error: list[Callable[[BaseException], None]] = field(default_factory=list)


def error_response(
    status_code: int,
    message: str,
    *,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=ErrorInfo(message=message, type=type_, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status_code)


def _sse(payload: Any) -> str:
    data = payload.model_dump() if hasattr(payload, "model_dump") else payload
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"


class EventStreamResponse(StreamingResponse):
    """Server-sent events whose request is closed (aborted if unfinished) however the
    response ends: finished, client gone, or server stopping."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], stream: RequestStream) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache"})
        self._request_stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._request_stream.close()


# -- the app -------------------------------------------------------------------------------------


def create_app(
    engine_factory: EngineFactory, *, model_name: str, max_stats_len: int = 1000
) -> FastAPI:
    """The server app; ``engine_factory()`` builds the engine on a thread at start-up.

    ``model_name`` is the id ``/v1/models`` lists and requests may name; ``max_stats_len``
    bounds the iteration records kept between two ``/metrics`` reads (oldest dropped first).
    """
    state = ServerState(model_name=model_name, max_stats_len=max_stats_len)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        loader = threading.Thread(
            target=_load_engine,
            args=(state, engine_factory, loop),
            name="spectool-load",
            daemon=True,
        )
        loader.start()
        try:
            yield
        finally:
            state.closing = True
            if state.driver is not None:
                state.driver.shutdown()

    app = FastAPI(
        title="spectool",
        version=spectool.__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.spectool = state
    _install_error_handlers(app)

    @app.get("/health")
    async def health() -> Response:
        if state.driver is not None and state.driver.alive:
            return Response(status_code=200)
        return _unavailable(state)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": spectool.__version__, "engine": ENGINE_NAME}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        max_len = state.driver.max_seq_len if state.driver is not None else None
        return ModelList(data=[ModelCard(id=state.model_name, max_model_len=max_len)]).model_dump()

    @app.get("/metrics")
    async def metrics() -> list[dict[str, Any]]:
        if state.driver is None:
            return []
        return [iteration_stats_json(s) for s in state.driver.drain_stats()]

    @app.get(PROMETHEUS_PATH)
    async def prometheus() -> Response:
        """Totals since start as Prometheus text (trtllm-serve's path and metric names)."""
        text = "" if state.driver is None else state.driver.prometheus(state.model_name)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/spectool/iterations")
    async def iterations(after: int = -1) -> list[dict[str, Any]]:
        """Iteration records numbered above ``after``, not drained (spectool's own reader:
        another client reading ``/metrics`` cannot take them away)."""
        if state.driver is None:
            return []
        return [iteration_stats_json(s) for s in state.driver.iterations_after(after)]

    @app.get("/spectool/draft_len")
    async def get_draft_len() -> dict[str, Any]:
        driver = _ready_driver(state)
        return _draft_len_json(driver)

    @app.post("/spectool/draft_len")
    async def set_draft_len(body: DraftLenRequest) -> dict[str, Any]:
        """Decode at draft length ``k`` from now on (0: speculation off; null: as configured).

        spectool's own endpoint (``tune`` pairs baseline and speculative blocks on one server
        with it); refused with 409 while requests are in flight."""
        driver = _ready_driver(state)
        try:
            driver.set_draft_len(body.k)
            logger.info(
                "draft length set to %s", "the configured one" if body.k is None else body.k
            )
        except EngineBusyError as exc:
            raise APIError(409, str(exc), param="k") from None
        except BadInputError as exc:
            raise APIError(400, str(exc), param="k") from None
        return _draft_len_json(driver)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        driver = _ready_driver(state)
        _check_model(state, body.model)
        prompt = body.prompt_text_or_ids()
        if isinstance(prompt, str):
            prompt_ids = driver.tokenizer.encode(prompt, add_special_tokens=body.add_special_tokens)
        else:
            prompt_ids = prompt
        max_tokens = body.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS
        _check_context(driver.max_seq_len, len(prompt_ids), body.max_tokens)
        stream = driver.submit(_generation_request(body, prompt_ids, max_tokens, driver.vocab_size))
        rid = completion_id()
        if body.stream:
            events = _completion_events(stream, rid, state.model_name, body)
            return EventStreamResponse(events, stream)
        result = await _collect(stream, request)
        if result is None:
            return Response(status_code=499)
        return JSONResponse(
            CompletionResponse(
                id=rid,
                model=state.model_name,
                choices=[
                    CompletionChoice(
                        text=result.text,
                        finish_reason=result.finish_reason,
                        token_ids=list(stream.token_ids) if body.return_token_ids else None,
                    )
                ],
                usage=Usage.of(stream.prompt_len, result.num_output_tokens),
                metrics=_spec_metrics(stream),
                prompt_token_ids=list(prompt_ids) if body.return_token_ids else None,
            ).model_dump()
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        driver = _ready_driver(state)
        _check_model(state, body.model)
        prompt_ids = driver.tokenizer.encode_chat(
            body.message_dicts(), add_generation_prompt=body.add_generation_prompt
        )
        limit = body.output_limit
        _check_context(driver.max_seq_len, len(prompt_ids), limit)
        max_tokens = limit if limit is not None else max(driver.max_seq_len - len(prompt_ids), 1)
        stream = driver.submit(_generation_request(body, prompt_ids, max_tokens, driver.vocab_size))
        rid = chat_completion_id()
        if body.stream:
            events = _chat_events(stream, rid, state.model_name, body)
            return EventStreamResponse(events, stream)
        result = await _collect(stream, request)
        if result is None:
            return Response(status_code=499)
        return JSONResponse(
            ChatCompletionResponse(
                id=rid,
                model=state.model_name,
                choices=[
                    ChatChoice(
                        message=AssistantMessage(content=result.text),
                        finish_reason=result.finish_reason,
                        token_ids=list(stream.token_ids) if body.return_token_ids else None,
                    )
                ],
                usage=Usage.of(stream.prompt_len, result.num_output_tokens),
                metrics=_spec_metrics(stream),
                prompt_token_ids=list(prompt_ids) if body.return_token_ids else None,
            ).model_dump()
        )

    return app


class DraftLenRequest(BaseModel):
    """Body of ``POST /spectool/draft_len``."""

    model_config = ConfigDict(extra="forbid")
    k: int | None = Field(ge=0)


def _draft_len_json(driver: AsyncEngine) -> dict[str, Any]:
    return {
        "draft_len": driver.engine.draft_len,
        "max_draft_len": driver.engine.max_draft_len,
        "last_iteration": driver.last_iteration(),
    }


def _load_engine(
    state: ServerState, factory: EngineFactory, loop: asyncio.AbstractEventLoop
) -> None:
    """Build the engine (on the loader thread) and hand it to the event loop."""
    t0 = time.perf_counter()
    try:
        engine = factory()
        driver = AsyncEngine(engine, max_stats_len=state.max_stats_len)
    except BaseException as exc:  # reported by /health and by the runner; never lost
        logger.error("model %s failed to load: %s", state.model_name, exc)
        state.load_error = exc
        try:
            loop.call_soon_threadsafe(_notify_load_error, state, exc)
        except RuntimeError:  # the loop already closed
            pass
        return
    load_s = time.perf_counter() - t0

    def install() -> None:
        if state.closing:
            return
        driver.start(loop)
        state.driver = driver
        state.load_s = load_s
        logger.info("model %s loaded in %.1f s", state.model_name, load_s)

    try:
        loop.call_soon_threadsafe(install)
    except RuntimeError:
        pass


def _notify_load_error(state: ServerState, exc: BaseException) -> None:
    for callback in state.on_load_error:
        callback(exc)


def _unavailable_message(state: ServerState) -> str:
    if state.load_error is not None:
        return f"model {state.model_name} failed to load: {state.load_error}"
    if state.driver is None:
        return f"model {state.model_name} is loading"
    return f"engine stopped: {state.driver.error or 'shutting down'}"


def _unavailable(state: ServerState) -> JSONResponse:
    return error_response(503, _unavailable_message(state), type_="service_unavailable")


def _ready_driver(state: ServerState) -> AsyncEngine:
    driver = state.driver
    if driver is None or not driver.alive:
        raise APIError(503, _unavailable_message(state), type_="service_unavailable")
    return driver


def _check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.model_name:
        raise APIError(
            404,
            f"The model `{model}` does not exist; this server serves `{state.model_name}`.",
            param="model",
            code="model_not_found",
        )


def _check_context(max_seq_len: int, prompt_len: int, max_tokens: int | None) -> None:
    """A requested output that cannot fit the context is refused (400, as vLLM does), not cut."""
    if max_tokens is not None and prompt_len + max_tokens > max_seq_len:
        raise APIError(
            400,
            f"This model's maximum context length is {max_seq_len} tokens. However, you "
            f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, "
            f"{max_tokens} in the completion). Please reduce the length of the prompt or "
            "completion.",
            param="max_tokens",
        )


def _generation_request(
    body: CompletionRequest | ChatCompletionRequest,
    prompt_ids: list[int],
    max_tokens: int,
    vocab_size: int,
) -> GenerationRequest:
    """Map an OpenAI request onto engine sampling (raises BadInputError on bad combinations).

    ``top_k`` of -1, 0 or at least ``vocab_size`` keeps the whole vocabulary; a temperature
    in (0, ``MIN_POSITIVE_TEMPERATURE``) is raised to it.
    """
    temperature = DEFAULT_TEMPERATURE if body.temperature is None else body.temperature
    if 0.0 < temperature < MIN_POSITIVE_TEMPERATURE:
        temperature = MIN_POSITIVE_TEMPERATURE
    top_k = body.top_k or 0
    if top_k < 0 or top_k >= vocab_size:
        top_k = 0
    params = SamplingParams(
        temperature=temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=top_k,
        seed=body.seed,
        max_tokens=max_tokens,
        min_tokens=body.min_tokens,
        ignore_eos=body.ignore_eos,
        stop_token_ids=tuple(body.stop_token_ids or ()),
    )
    return GenerationRequest(
        prompt_ids=tuple(prompt_ids),
        params=params,
        stop=body.stop_strings,
        include_stop_str_in_output=body.include_stop_str_in_output,
        skip_special_tokens=body.skip_special_tokens,
    )


# -- non-streamed responses ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Result:
    text: str
    finish_reason: str | None
    num_output_tokens: int


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _collect(stream: RequestStream, request: Request) -> _Result | None:
    """Run a request to its end; None if the client disconnected first (request aborted)."""

    async def consume() -> _Result:
        parts: list[str] = []
        last: Delta | None = None
        async for delta in stream:
            parts.append(delta.text)
            last = delta
        return _Result(
            text="".join(parts),
            finish_reason=last.finish_reason if last is not None else stream.finish_reason,
            num_output_tokens=len(stream.token_ids),
        )

    consumer = asyncio.ensure_future(consume())
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if consumer in done:
            return consumer.result()
        return None
    finally:
        for task in (consumer, watcher):
            task.cancel()
        stream.close()


# -- streamed responses --------------------------------------------------------------------------


def _worth_a_chunk(delta: Delta, with_token_ids: bool) -> bool:
    """Text, the end, or (when token ids are returned) new ids; held-back steps send nothing."""
    return bool(delta.text or delta.finished or (with_token_ids and delta.token_ids))


def _stream_error(exc: Exception) -> str:
    error = ErrorInfo(message=str(exc), type="service_unavailable")
    return _sse(ErrorResponse(error=error))


def _spec_metrics(stream: RequestStream) -> dict[str, Any] | None:
    """vLLM's per-request ``metrics`` object when the engine speculated (else omitted)."""
    if stream.spec_stats is None:
        return None
    return {"speculative_decoding": stream.spec_stats}


async def _completion_events(
    stream: RequestStream, rid: str, model: str, body: CompletionRequest
) -> AsyncIterator[str]:
    created = int(time.time())
    try:
        try:
            async for delta in stream:
                if not _worth_a_chunk(delta, body.return_token_ids):
                    continue
                choice = CompletionChoice(
                    text=delta.text,
                    finish_reason=delta.finish_reason,
                    token_ids=list(delta.token_ids) if body.return_token_ids else None,
                )
                usage = (
                    Usage.of(stream.prompt_len, delta.num_output_tokens)
                    if body.continuous_usage
                    else None
                )
                yield _sse(
                    CompletionResponse(
                        id=rid, created=created, model=model, choices=[choice], usage=usage
                    )
                )
        except EngineDeadError as exc:
            yield _stream_error(exc)
            yield SSE_DONE
            return
        if body.include_usage:
            usage = Usage.of(stream.prompt_len, len(stream.token_ids))
            yield _sse(
                CompletionResponse(
                    id=rid,
                    created=created,
                    model=model,
                    choices=[],
                    usage=usage,
                    metrics=_spec_metrics(stream),
                )
            )
        yield SSE_DONE
    finally:
        stream.close()


async def _chat_events(
    stream: RequestStream, rid: str, model: str, body: ChatCompletionRequest
) -> AsyncIterator[str]:
    created = int(time.time())

    def chunk(choice: ChatChunkChoice, n_tokens: int = 0) -> str:
        usage = Usage.of(stream.prompt_len, n_tokens) if body.continuous_usage else None
        return _sse(
            ChatCompletionChunk(id=rid, created=created, model=model, choices=[choice], usage=usage)
        )

    try:
        yield chunk(ChatChunkChoice(delta=ChatDelta(role="assistant", content="")))
        try:
            async for delta in stream:
                if not _worth_a_chunk(delta, body.return_token_ids):
                    continue
                yield chunk(
                    ChatChunkChoice(
                        delta=ChatDelta(content=delta.text or None),
                        finish_reason=delta.finish_reason,
                        token_ids=list(delta.token_ids) if body.return_token_ids else None,
                    ),
                    delta.num_output_tokens,
                )
        except EngineDeadError as exc:
            yield _stream_error(exc)
            yield SSE_DONE
            return
        if body.include_usage:
            usage = Usage.of(stream.prompt_len, len(stream.token_ids))
            yield _sse(
                ChatCompletionChunk(
                    id=rid,
                    created=created,
                    model=model,
                    choices=[],
                    usage=usage,
                    metrics=_spec_metrics(stream),
                )
            )
        yield SSE_DONE
    finally:
        stream.close()


# -- errors --------------------------------------------------------------------------------------


def _validation_message(error: dict[str, Any]) -> tuple[str, str | None]:
    """One readable line and the offending top-level parameter for a validation error."""
    loc = [str(part) for part in error.get("loc", ()) if part != "body"]
    path = ".".join(loc)
    param = loc[0] if loc else None
    kind = error.get("type", "")
    if kind == "json_invalid":
        detail = (error.get("ctx") or {}).get("error", "")
        return f"request body is not valid JSON{': ' + str(detail) if detail else ''}", None
    if kind == "extra_forbidden":
        return f"unsupported parameter '{path}'", param
    if kind == "missing":
        return f"missing required parameter '{path}'", param
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    return (f"{path}: {message}" if path else message), param


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        message, param = _validation_message(errors[0]) if errors else ("invalid request", None)
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problems)"
        return error_response(400, message, param=param)

    @app.exception_handler(BadInputError)
    async def _on_bad_input(request: Request, exc: BadInputError) -> JSONResponse:
        return error_response(400, str(exc), param=exc.where)

    @app.exception_handler(APIError)
    async def _on_api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(
            exc.status_code, exc.message, type_=exc.type, param=exc.param, code=exc.code
        )

    @app.exception_handler(EngineDeadError)
    async def _on_engine_dead(request: Request, exc: EngineDeadError) -> JSONResponse:
        return error_response(503, str(exc), type_="service_unavailable")

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s", request.url.path)
        return error_response(500, "internal server error", type_="server_error")
