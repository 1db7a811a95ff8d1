"""The OpenAI-compatible FastAPI app over spectool's embedded engine.

Endpoints: ``GET /health`` (503 while the model loads, 200 after; trtllm-serve's contract),
``GET /version``, ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(streamed as server-sent events or not), ``GET /metrics`` (TensorRT-LLM's iteration-stats
JSON, drained on read: see :mod:`spectool.server.metrics`) and ``GET /prometheus/metrics``
(totals as Prometheus text, never drained). spectool's own: ``GET|POST /spectool/draft_len``
(the draft length switched in place, for ``tune``'s paired blocks) and
``GET /spectool/iterations?after=N[&last=M]`` (iteration stats paged by number, not drained;
``last``: only the newest M of them).

The model loads on a background thread once the app starts, so the socket answers ``/health``
during the load. Every malformed request gets a 4xx JSON body in OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}``; a client that disconnects has its request
aborted in the engine, freeing its batch slot.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

import spectool
from spectool.engine.engine import Engine, EngineBusyError
from spectool.errors import BadInputError
from spectool.server.driver import (
    AsyncEngine,
    RequestStream,
)
from spectool.server.errors import APIError, error_response, install_error_handlers
from spectool.server.generation import check_context, generation_request
from spectool.server.metrics import PROMETHEUS_PATH, iteration_stats_json
from spectool.server.responses import (
    EventStreamResponse,
    Result,
    chat_events,
    collect,
    completion_events,
    spec_metrics,
)
from spectool.server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
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

EngineFactory = Callable[[], Engine]


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


# -- the app -------------------------------------------------------------------------------------


def create_app(
    engine_factory: EngineFactory,
    *,
    model_name: str,
    max_stats_len: int = 1000,
    description: str | None = None,
) -> FastAPI:
    """The server app; ``engine_factory()`` builds the engine on a thread at start-up.

    ``model_name`` is the id ``/v1/models`` lists and requests may name (with ``description``,
    when given, in its card); ``max_stats_len`` bounds the iteration records kept between two
    ``/metrics`` reads (oldest dropped first).
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
    install_error_handlers(app)

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
        card = ModelCard(id=state.model_name, max_model_len=max_len, description=description)
        return ModelList(data=[card]).model_dump()

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
    async def iterations(after: int = -1, last: int | None = None) -> list[dict[str, Any]]:
        """Iteration records numbered above ``after``, not drained (spectool's own reader:
        another client reading ``/metrics`` cannot take them away)."""
        if state.driver is None:
            return []
        records = state.driver.iterations_after(after)
        if last is not None:  # only the newest ``last`` (a reader finding where it starts)
            records = records[len(records) - max(last, 0) :] if last > 0 else []
        return [iteration_stats_json(s) for s in records]

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
            driver.set_draft_len(body.k, method=body.method)
            logger.info(
                "draft length set to %s%s",
                "the configured one" if body.k is None else body.k,
                "" if body.method is None else f", method {body.method}",
            )
        except EngineBusyError as exc:
            raise APIError(409, str(exc), param="k") from None
        except BadInputError as exc:
            raise APIError(
                400, str(exc), param="method" if exc.where == "method" else "k"
            ) from None
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
        check_context(driver.max_seq_len, len(prompt_ids), body.max_tokens)
        stream = driver.submit(generation_request(body, prompt_ids, max_tokens, driver.vocab_size))
        rid = completion_id()
        events = completion_events(stream, rid, state.model_name, body) if body.stream else None

        def whole(result: Result) -> CompletionResponse:
            fields, choice = _whole_fields(stream, result, rid, state.model_name, body, prompt_ids)
            return CompletionResponse(
                **fields, choices=[CompletionChoice(text=result.text, **choice)]
            )

        return await _answer(stream, request, events, whole)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        driver = _ready_driver(state)
        _check_model(state, body.model)
        prompt_ids = driver.tokenizer.encode_chat(
            body.message_dicts(), add_generation_prompt=body.add_generation_prompt
        )
        limit = body.output_limit
        check_context(driver.max_seq_len, len(prompt_ids), limit)
        max_tokens = limit if limit is not None else max(driver.max_seq_len - len(prompt_ids), 1)
        stream = driver.submit(generation_request(body, prompt_ids, max_tokens, driver.vocab_size))
        rid = chat_completion_id()
        events = chat_events(stream, rid, state.model_name, body) if body.stream else None

        def whole(result: Result) -> ChatCompletionResponse:
            fields, choice = _whole_fields(stream, result, rid, state.model_name, body, prompt_ids)
            message = AssistantMessage(content=result.text)
            return ChatCompletionResponse(**fields, choices=[ChatChoice(message=message, **choice)])

        return await _answer(stream, request, events, whole)

    return app


async def _answer(
    stream: RequestStream,
    request: Request,
    events: AsyncIterator[str] | None,
    whole: Callable[[Result], BaseModel],
) -> Response:
    """The ``events`` as a stream when there are any, else the request run to its end and
    answered ``whole`` (499 when the client went away first)."""
    if events is not None:
        return EventStreamResponse(events, stream)
    result = await collect(stream, request)
    if result is None:
        return Response(status_code=499)
    return JSONResponse(whole(result).model_dump())


def _whole_fields(
    stream: RequestStream,
    result: Result,
    rid: str,
    model: str,
    body: CompletionRequest | ChatCompletionRequest,
    prompt_ids: list[int],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a whole (not streamed) completion and chat response share: the response's fields
    and the choice's."""
    with_ids = body.return_token_ids
    response = {
        "id": rid,
        "model": model,
        "usage": Usage.of(stream.prompt_len, result.num_output_tokens),
        "metrics": spec_metrics(stream),
        "prompt_token_ids": list(prompt_ids) if with_ids else None,
    }
    choice = {
        "finish_reason": result.finish_reason,
        "token_ids": list(stream.token_ids) if with_ids else None,
    }
    return response, choice


class DraftLenRequest(BaseModel):
    """Body of ``POST /spectool/draft_len``."""

    model_config = ConfigDict(extra="forbid")
    k: int | None = Field(ge=0)
    # another method the engine holds (tune compares methods on one server); None: keep it
    method: str | None = None


def _draft_len_json(driver: AsyncEngine) -> dict[str, Any]:
    return {
        "draft_len": driver.engine.draft_len,
        "method": driver.engine.method,
        "methods": list(driver.engine.methods),
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
