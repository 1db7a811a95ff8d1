"""Responses to generation requests: a request run to its end (or aborted when the client goes),
and server-sent event streams of completion and chat chunks."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from spectool.server.driver import Delta, EngineDeadError, RequestStream
from spectool.server.schemas import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ErrorInfo,
    ErrorResponse,
    Usage,
)


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


@dataclass(frozen=True)
class Result:
    text: str
    finish_reason: str | None
    num_output_tokens: int


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def collect(stream: RequestStream, request: Request) -> Result | None:
    """Run a request to its end; None if the client disconnected first (request aborted)."""

    async def consume() -> Result:
        parts: list[str] = []
        last: Delta | None = None
        async for delta in stream:
            parts.append(delta.text)
            last = delta
        return Result(
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


def _worth_a_chunk(delta: Delta, with_token_ids: bool) -> bool:
    """Text, the end, or (when token ids are returned) new ids; held-back steps send nothing."""
    return bool(delta.text or delta.finished or (with_token_ids and delta.token_ids))


def _stream_error(exc: Exception) -> str:
    error = ErrorInfo(message=str(exc), type="service_unavailable")
    return _sse(ErrorResponse(error=error))


def spec_metrics(stream: RequestStream) -> dict[str, Any] | None:
    """vLLM's per-request ``metrics`` object when the engine speculated (else omitted)."""
    if stream.spec_stats is None:
        return None
    return {"speculative_decoding": stream.spec_stats}


async def _events(
    stream: RequestStream,
    body: CompletionRequest | ChatCompletionRequest,
    chunk: Callable[[Delta], str],
    usage_chunk: Callable[[], str],
    first: str | None = None,
) -> AsyncIterator[str]:
    """The events of one streamed request: ``first`` (if any), a ``chunk`` per delta worth one,
    the ``usage_chunk`` when asked for, then ``[DONE]``; an engine that dies mid-stream ends it
    with an error event. The request is closed however the stream ends."""
    try:
        if first is not None:
            yield first
        try:
            async for delta in stream:
                if _worth_a_chunk(delta, body.return_token_ids):
                    yield chunk(delta)
        except EngineDeadError as exc:
            yield _stream_error(exc)
            yield SSE_DONE
            return
        if body.include_usage:
            yield usage_chunk()
        yield SSE_DONE
    finally:
        stream.close()


def _usage_event(
    kind: type[CompletionResponse] | type[ChatCompletionChunk],
    stream: RequestStream,
    rid: str,
    created: int,
    model: str,
) -> str:
    """The last chunk of a stream that asked for usage: no choices, the whole request's usage
    and speculation metrics."""
    usage = Usage.of(stream.prompt_len, len(stream.token_ids))
    return _sse(
        kind(
            id=rid,
            created=created,
            model=model,
            choices=[],
            usage=usage,
            metrics=spec_metrics(stream),
        )
    )


def completion_events(
    stream: RequestStream, rid: str, model: str, body: CompletionRequest
) -> AsyncIterator[str]:
    """``/v1/completions`` as server-sent events."""
    created = int(time.time())

    def chunk(delta: Delta) -> str:
        choice = CompletionChoice(
            text=delta.text,
            finish_reason=delta.finish_reason,
            token_ids=list(delta.token_ids) if body.return_token_ids else None,
        )
        usage = (
            Usage.of(stream.prompt_len, delta.num_output_tokens) if body.continuous_usage else None
        )
        return _sse(
            CompletionResponse(id=rid, created=created, model=model, choices=[choice], usage=usage)
        )

    usage_chunk = partial(_usage_event, CompletionResponse, stream, rid, created, model)
    return _events(stream, body, chunk, usage_chunk)


def chat_events(
    stream: RequestStream, rid: str, model: str, body: ChatCompletionRequest
) -> AsyncIterator[str]:
    """``/v1/chat/completions`` as server-sent events (the first chunk names the role)."""
    created = int(time.time())

    def chat_chunk(choice: ChatChunkChoice, n_tokens: int = 0) -> str:
        usage = Usage.of(stream.prompt_len, n_tokens) if body.continuous_usage else None
        return _sse(
            ChatCompletionChunk(id=rid, created=created, model=model, choices=[choice], usage=usage)
        )

    def chunk(delta: Delta) -> str:
        return chat_chunk(
            ChatChunkChoice(
                delta=ChatDelta(content=delta.text or None),
                finish_reason=delta.finish_reason,
                token_ids=list(delta.token_ids) if body.return_token_ids else None,
            ),
            delta.num_output_tokens,
        )

    usage_chunk = partial(_usage_event, ChatCompletionChunk, stream, rid, created, model)
    first = chat_chunk(ChatChunkChoice(delta=ChatDelta(role="assistant", content="")))
    return _events(stream, body, chunk, usage_chunk, first)
