"""The streaming client against spectool's real server, plus its pure token-counting rules."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from spectool.measure.client import (
    RequestOptions,
    StreamChunk,
    StreamingClient,
    StreamResult,
    chunk_token_counts,
    request_body,
    rescale_counts,
    tokenizer_counter,
)
from spectool.measure.workloads import Prompt

from .conftest import MODEL_NAME

PROMPT = Prompt("p0", "unit", "The draft model proposes tokens and the target")


def _send(
    url: str,
    *,
    model: str = MODEL_NAME,
    count_tokens=None,
    max_tokens: int = 12,
    options: RequestOptions | None = None,
    repeat: int = 1,
) -> tuple[list[StreamResult], bool]:
    async def main() -> tuple[list[StreamResult], bool]:
        async with StreamingClient(url, model, count_tokens=count_tokens) as client:
            results = [
                await client.stream(
                    PROMPT, request_id=f"q{i}", max_tokens=max_tokens, options=options
                )
                for i in range(repeat)
            ]
            return results, client.continuous_usage_refused

    return asyncio.run(main())


def _check_ok(result: StreamResult, max_tokens: int) -> None:
    record = result.record
    assert record.error is None, record.error
    assert result.http_status == 200
    assert record.output_tokens == max_tokens  # ignore_eos + min_tokens: exact length
    assert sum(record.chunk_token_counts) == record.output_tokens
    assert record.first_token_time_s is not None
    assert record.send_time_s <= record.first_token_time_s <= record.end_time_s
    assert record.ttft_s is not None and record.ttft_s <= record.e2e_s
    assert record.prompt_tokens > 0
    assert result.finish_reason == "length"
    assert result.text


def test_request_body_is_fixed_length_greedy_and_never_asks_for_logprobs() -> None:
    body = request_body("m", "hello", 7, RequestOptions())
    assert body == {
        "model": "m",
        "prompt": "hello",
        "max_tokens": 7,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "ignore_eos": True,
        "min_tokens": 7,
    }
    chat = request_body("m", "hi", 3, RequestOptions(api="chat", fixed_length=False))
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    assert "ignore_eos" not in chat and "min_tokens" not in chat and "prompt" not in chat
    for b in (body, chat):
        assert not any("logprob" in key for key in b)


def test_rescale_counts_keeps_zeros_and_hits_the_total() -> None:
    assert rescale_counts([1, 1, 0, 1, 1], 8) == [2, 2, 0, 2, 2]
    assert rescale_counts([1, 2, 1], 5) == [1, 3, 1]
    assert rescale_counts([3, 0, 1], 2) == [2, 0, 0]
    assert rescale_counts([0, 0], 4) == [0, 0]  # no weight: nothing to scale
    for counts, total in (([5, 1, 1, 2], 13), ([1] * 7, 3), ([2, 9], 11)):
        assert sum(rescale_counts(counts, total)) == total


def test_chunk_token_counts_sources() -> None:
    # Continuous usage: the rise of completion_tokens; the usage-only last chunk counts 0.
    chunks = [
        StreamChunk(0.1, "ab", True, 1),
        StreamChunk(0.2, "cde", True, 4),
        StreamChunk(0.3, "", True, 4),
        StreamChunk(0.4, "", False, 4),
    ]
    assert chunk_token_counts(chunks, 4) == ([1, 3, 0, 0], "usage")
    # No per-chunk usage: the tokenizer's counts, rescaled to the final total.
    plain = [StreamChunk(0.1, "ab", True, None), StreamChunk(0.2, "cdef", True, None)]
    assert chunk_token_counts(plain, 6, len) == ([2, 4], "tokenizer")
    assert chunk_token_counts(plain, 3, len) == ([1, 2], "tokenizer")
    # Neither: one per chunk with text, rescaled when the total is known.
    assert chunk_token_counts(plain, None) == ([1, 1], "chunks")
    assert chunk_token_counts(plain, 5) == ([3, 2], "chunks")


def test_completion_stream_against_the_server(
    server_url: str, measure_models: tuple[Path, Path]
) -> None:
    count = tokenizer_counter(measure_models[0])
    (first, second), refused = _send(server_url, count_tokens=count, repeat=2)
    for result in (first, second):
        _check_ok(result, 12)
        # Exact per-chunk usage when the server sends it; else the target's tokenizer.
        assert result.token_count_source == ("tokenizer" if refused else "usage")
    assert first.text == second.text  # temperature 0: greedy and repeatable
    # Speculation puts several tokens into one chunk: fewer token chunks than tokens.
    assert sum(1 for n in first.record.chunk_token_counts if n) < first.record.output_tokens


def test_chat_stream_counts_the_role_chunk_as_zero(server_url: str) -> None:
    (result,), refused = _send(server_url, options=RequestOptions(api="chat"))
    _check_ok(result, 12)
    record = result.record
    assert record.chunk_token_counts[0] == 0  # {"role": "assistant", "content": ""}
    assert record.first_token_time_s == record.chunk_times_s[1]
    assert result.token_count_source == ("chunks" if refused else "usage")


def test_without_continuous_usage_nothing_is_refused(server_url: str) -> None:
    (result,), refused = _send(server_url, options=RequestOptions(continuous_usage=False))
    _check_ok(result, 12)
    assert not refused
    assert result.token_count_source == "chunks"


def test_http_errors_become_records(server_url: str) -> None:
    (result,), _ = _send(server_url, model="no-such-model")
    assert result.http_status == 404
    assert result.record.error is not None and result.record.error.startswith("HTTP 404: ")
    assert "no-such-model" in result.record.error
    assert result.record.output_tokens == 0 and result.record.first_token_time_s is None


def test_connection_failures_become_records() -> None:
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (result,), _ = _send(f"http://127.0.0.1:{port}/v1")
    assert result.http_status is None
    assert result.record.error is not None and "ConnectError" in result.record.error
    assert not result.record.ok


def test_served_models(server_url: str) -> None:
    async def main() -> list[str]:
        async with StreamingClient(server_url + "/v1/", MODEL_NAME) as client:
            return await client.served_models()

    assert asyncio.run(main()) == [MODEL_NAME]


def test_bad_url_is_bad_input() -> None:
    from spectool.errors import BadInputError

    with pytest.raises(BadInputError, match="expected http"):
        StreamingClient("localhost:8000", MODEL_NAME)


def test_request_body_sends_the_prompts_own_sampling() -> None:
    from spectool.errors import BadInputError
    from spectool.measure.workloads import Prompt

    own = Prompt("p", "c", "hi", 5, temperature=0.7, top_p=0.9, stop=("\n", "END"))
    body = request_body("m", own, 5, RequestOptions(temperature=0.0))
    assert (body["temperature"], body["top_p"], body["stop"]) == (0.7, 0.9, ["\n", "END"])
    default = request_body("m", Prompt("q", "c", "hi"), 5, RequestOptions(top_p=0.5))
    assert default["top_p"] == 0.5 and "stop" not in default
    with pytest.raises(BadInputError, match="top_p"):
        RequestOptions(top_p=0.0)


def _sent_bodies(prompts: list[Prompt], options: RequestOptions) -> list[tuple[str, dict]]:
    """(path, JSON body) of every request the client sends for ``prompts``, answered by a
    stand-in server with one text chunk, usage and [DONE]."""
    import json

    import httpx

    sent: list[tuple[str, dict]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append((request.url.path, json.loads(request.content)))
        chunk = {"choices": [{"index": 0, "text": "x", "delta": {"content": "x"}}]}
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
        events = "".join(f"data: {json.dumps(c)}\n\n" for c in (chunk, usage)) + "data: [DONE]\n\n"
        return httpx.Response(200, text=events, headers={"content-type": "text/event-stream"})

    async def main() -> None:
        http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
        async with http, StreamingClient("http://test", "m", http=http) as client:
            for i, prompt in enumerate(prompts):
                await client.stream(prompt, request_id=f"r{i}", max_tokens=4, options=options)

    asyncio.run(main())
    return sent


def test_chat_log_requests_go_to_the_chat_endpoint_with_their_own_sampling() -> None:
    from spectool.measure.workload_files import read_workload

    log = Path(__file__).resolve().parents[1] / "data" / "workloads" / "chat.jsonl"
    first, second, _ = read_workload(log).prompts
    plain = Prompt("p", "c", "hi", temperature=0.3)
    sent = _sent_bodies([first, second, plain], RequestOptions(temperature=0.0, top_p=0.8))
    assert [path for path, _ in sent] == ["/v1/chat/completions"] * 2 + ["/v1/completions"]
    (_, one), (_, two), (_, three) = sent
    assert one["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime."},
    ]
    assert "prompt" not in one
    assert (one["temperature"], one["top_p"], one["stop"]) == (0.7, 0.9, ["\n\n"])
    # a request without its own settings gets the trial's
    assert (two["temperature"], two["top_p"], "stop" in two) == (0.0, 0.8, False)
    assert two["messages"] == [{"role": "user", "content": "Count to three."}]
    assert (three["prompt"], three["temperature"], three["top_p"]) == ("hi", 0.3, 0.8)


def test_a_chat_log_request_against_the_server(server_url: str) -> None:
    from spectool.measure.workloads import ChatMessage

    messages = (ChatMessage("system", "Be brief."), ChatMessage("user", "The draft model"))
    prompt = Prompt("c", "chat", "rendered", 6, temperature=0.8, top_p=0.9, messages=messages)

    async def main() -> StreamResult:
        async with StreamingClient(server_url, MODEL_NAME) as client:
            return await client.stream(prompt, request_id="c0", max_tokens=6)

    result = asyncio.run(main())
    _check_ok(result, 6)
    assert result.record.chunk_token_counts[0] == 0  # the chat stream's role chunk


def _first_chunk_calls(events: str, status: int = 200) -> tuple[list[float], StreamResult]:
    """Times at which ``on_first_chunk`` fired for one request answered with ``events``."""
    import httpx

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, text=events, headers={"content-type": "text/event-stream"})

    calls: list[float] = []

    async def main() -> StreamResult:
        import time

        http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
        async with http, StreamingClient("http://test", "m", http=http) as client:
            return await client.stream(
                PROMPT,
                request_id="r0",
                max_tokens=4,
                on_first_chunk=lambda: calls.append(time.perf_counter()),
            )

    return calls, asyncio.run(main())


def test_on_first_chunk_fires_once_at_the_first_chunk_and_for_a_failed_request() -> None:
    import json

    chunk = {"choices": [{"index": 0, "text": "x"}]}
    events = "".join(f"data: {json.dumps(chunk)}\n\n" for _ in range(3)) + "data: [DONE]\n\n"
    calls, result = _first_chunk_calls(events)
    assert result.record.error is None and len(result.record.chunk_times_s) == 3
    assert len(calls) == 1 and calls[0] <= result.record.chunk_times_s[1]
    # no chunk at all (the server refused): the caller is told anyway, once, so nobody waits
    calls, result = _first_chunk_calls("overloaded", status=503)
    assert result.record.error is not None and len(calls) == 1
