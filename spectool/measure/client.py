"""Streaming client for OpenAI-compatible servers: one request in, one timed RequestRecord out.

Works against ``trtllm-serve``, spectool's own server, vLLM and SGLang. Every request streams
(``stream: true``) with ``stream_options: {"include_usage": true}`` so the final chunk carries
the server's token counts, uses temperature 0 unless told otherwise and, by default, asks for a
fixed output length (``max_tokens`` with ``ignore_eos: true`` and ``min_tokens = max_tokens``,
extensions all four servers accept). It never asks for logprobs: TensorRT-LLM rejects them when
speculative decoding is configured.

Timing uses ``time.perf_counter()`` (seconds): ``send_time_s`` just before the request is
written, one arrival time per streamed ``data:`` chunk, ``end_time_s`` after ``[DONE]``.

Tokens per chunk (:data:`TokenCountSource`, reported with every result): under speculative
decoding one chunk can carry several tokens, so counting chunks is not counting tokens.

* ``"usage"``: the server sent usage in every chunk (``continuous_usage_stats: true``, asked
  for by default; vLLM, SGLang and TensorRT-LLM accept the key): a chunk's count is the rise of
  ``usage.completion_tokens``. Exact. A server that refuses the key (HTTP 400 naming it) gets
  the request again without it, once per client.
* ``"tokenizer"``: else, with a ``count_tokens`` function (the target's tokenizer), each chunk's
  text is tokenized on its own;
* ``"chunks"``: else one token per chunk that carried text.

The last two are estimates; when the final usage gives the total they are rescaled to sum to it
(largest remainder, chunks without text stay at 0). The output token count is always the final
``usage.completion_tokens`` when the server sent one.

Failures never raise: an HTTP status other than 200, a connection error, a malformed chunk or a
stream that ends before ``[DONE]`` becomes a record whose ``error`` says what happened.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from spectool.decide.latency import RequestRecord
from spectool.errors import BadInputError
from spectool.measure.workloads import Prompt

Api = Literal["completions", "chat"]
TokenCountSource = Literal["usage", "tokenizer", "chunks"]
TOKEN_COUNT_SOURCES: tuple[str, ...] = ("usage", "tokenizer", "chunks")

_MAX_ERROR_BODY_CHARS = 300


@dataclass(frozen=True)
class RequestOptions:
    """How every request of a trial is sent.

    ``fixed_length`` adds ``ignore_eos: true`` and ``min_tokens = max_tokens`` so every request
    produces exactly ``max_tokens`` tokens (comparable runs, as vLLM's ``--ignore-eos``).
    ``continuous_usage`` asks for usage in every chunk (exact tokens per chunk); turn it off for
    servers that reject the ``continuous_usage_stats`` key. ``timeout_s``: longest wait for any
    single network operation (connect, or the next bytes of the stream).
    """

    api: Api = "completions"
    temperature: float = 0.0
    top_p: float = 1.0
    fixed_length: bool = True
    continuous_usage: bool = True
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.api not in ("completions", "chat"):
            raise BadInputError("api", f"must be 'completions' or 'chat', got {self.api!r}")
        if not self.temperature >= 0:
            raise BadInputError("temperature", f"must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise BadInputError("top_p", f"must be in (0, 1], got {self.top_p}")
        if not self.timeout_s > 0:
            raise BadInputError("timeout", f"must be > 0 s, got {self.timeout_s}")


@dataclass(frozen=True)
class StreamResult:
    """One streamed request: the record, how its chunk token counts were obtained, the text.

    ``http_status`` is None when no response arrived; ``finish_reason`` is the server's last one.
    """

    record: RequestRecord
    token_count_source: TokenCountSource
    text: str
    finish_reason: str | None
    http_status: int | None


def request_api(prompt: str | Prompt, options: RequestOptions) -> Api:
    """The endpoint a prompt goes to: ``chat`` for a chat request's messages (a chat log),
    else ``options.api``."""
    if isinstance(prompt, Prompt) and prompt.messages is not None:
        return "chat"
    return options.api


def request_body(
    model: str, prompt: str | Prompt, max_tokens: int, options: RequestOptions
) -> dict[str, Any]:
    """The JSON body of one streaming request (no logprobs, ever).

    A :class:`Prompt` that carries its own ``temperature``, ``top_p`` or ``stop`` (an OpenAI
    request log) is sent with them; otherwise ``options`` apply. ``top_p`` is sent only when it
    is not 1 (the OpenAI default), so bodies of greedy runs are unchanged. A prompt with chat
    ``messages`` is a chat request with them (:func:`request_api`), so the server renders them
    with its own chat template.
    """
    api = request_api(prompt, options)
    own = prompt.sampling() if isinstance(prompt, Prompt) else {}
    chat = prompt.messages if isinstance(prompt, Prompt) else None
    if isinstance(prompt, Prompt):
        prompt = prompt.text
    messages = [m.to_json() for m in chat] if chat else [{"role": "user", "content": prompt}]
    if max_tokens < 1:
        raise BadInputError("max_tokens", f"must be >= 1, got {max_tokens}")
    stream_options: dict[str, bool] = {"include_usage": True}
    if options.continuous_usage:
        stream_options["continuous_usage_stats"] = True
    body: dict[str, Any] = {"model": model}
    if api == "chat":
        body["messages"] = messages
    else:
        body["prompt"] = prompt
    body.update(
        max_tokens=max_tokens,
        temperature=own.get("temperature", options.temperature),
        stream=True,
        stream_options=stream_options,
    )
    top_p = own.get("top_p", options.top_p)
    if top_p != 1.0 or "top_p" in own:
        body["top_p"] = top_p
    if "stop" in own:
        body["stop"] = list(own["stop"])
    if options.fixed_length:
        body.update(ignore_eos=True, min_tokens=max_tokens)
    return body


def tokenizer_counter(tokenizer_json: str | Path) -> Callable[[str], int]:
    """``text -> token count`` with a ``tokenizer.json`` (no special tokens added); the file
    is parsed once per process while it is unchanged (a tune run asks twice, a comparison of
    methods once per method: a large tokenizer.json takes most of a second each time)."""
    path = Path(tokenizer_json)
    if path.is_dir():
        path = path / "tokenizer.json"
    try:
        stat = path.stat()
    except OSError as e:
        raise BadInputError(path, f"cannot load tokenizer: {e.strerror or e}") from None
    tokenizer = _load_tokenizer(str(path.resolve()), stat.st_size, stat.st_mtime_ns)

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return count


@functools.lru_cache(maxsize=4)
def _load_tokenizer(path: str, _size: int, _mtime_ns: int) -> Any:
    """The parsed ``tokenizer.json`` at ``path`` (size and mtime key the cache)."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises plain Exception subclasses
        raise BadInputError(path, f"cannot load tokenizer: {e}") from e


def rescale_counts(counts: Sequence[int], total: int) -> list[int]:
    """Integer counts proportional to ``counts`` that sum to ``total`` (largest remainder).

    Zero entries stay zero; with no positive entry the counts are returned unchanged.
    """
    weight = sum(counts)
    if weight <= 0 or total < 0:
        return list(counts)
    shares = [c * total / weight for c in counts]
    floors = [int(s) for s in shares]
    left = total - sum(floors)
    by_remainder = sorted(range(len(counts)), key=lambda i: (floors[i] - shares[i], i))
    for i in by_remainder[:left]:
        floors[i] += 1
    return floors


@dataclass(frozen=True)
class StreamChunk:
    """One parsed ``data:`` chunk: arrival time (s), its text, whether it had choices, and
    ``usage.completion_tokens`` when the chunk carried usage."""

    time_s: float
    text: str
    has_choice: bool
    completion_tokens: int | None


def _chunk_text(choice: dict[str, Any], api: Api) -> str:
    if api == "chat":
        delta = choice.get("delta") or {}
        parts = (delta.get("content"), delta.get("reasoning_content"))
    else:
        parts = (choice.get("text"),)
    return "".join(p for p in parts if isinstance(p, str))


def _usage_int(usage: Any, key: str) -> int | None:
    if not isinstance(usage, dict):
        return None
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def chunk_token_counts(
    chunks: Sequence[StreamChunk],
    total: int | None,
    count_tokens: Callable[[str], int] | None = None,
) -> tuple[list[int], TokenCountSource]:
    """Tokens per chunk and where they came from (see the module docstring).

    ``total`` is the final ``usage.completion_tokens`` (None when the server sent no usage).
    """
    with_choice = [c for c in chunks if c.has_choice]
    if with_choice and all(c.completion_tokens is not None for c in with_choice):
        counts, seen = [], 0
        for c in chunks:
            now = c.completion_tokens if c.completion_tokens is not None else seen
            counts.append(max(now - seen, 0))
            seen = max(seen, now)
        return counts, "usage"
    if count_tokens is not None:
        counts = [count_tokens(c.text) if c.text else 0 for c in chunks]
        source: TokenCountSource = "tokenizer"
    else:
        counts = [1 if c.text else 0 for c in chunks]
        source = "chunks"
    if total is not None:
        counts = rescale_counts(counts, total)
    return counts, source


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The TLS context every HTTP client of this process shares: building one loads the
    system's CA certificates (about 0.1 s), which tune would otherwise pay for every block it
    measures and every draft-length switch."""
    return httpx.create_ssl_context()


class StreamingClient:
    """Async client of one OpenAI-compatible server (``base_url`` with or without ``/v1``).

    Use as ``async with StreamingClient(url, model) as client: await client.stream(...)``.
    ``count_tokens`` (e.g. :func:`tokenizer_counter` of the target) is the fallback for servers
    that send no per-chunk usage. Connections are not capped here; the load runner decides how
    many requests are in flight. ``continuous_usage_refused`` turns True once the server has
    refused ``continuous_usage_stats``; later requests leave it out.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        count_tokens: Callable[[str], int] | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        base = base_url.rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        if not base.startswith(("http://", "https://")):
            raise BadInputError("url", f"expected http(s)://host:port, got {base_url!r}")
        self.base_url = base
        self.model = model
        self.count_tokens = count_tokens
        self.continuous_usage_refused = False
        self._own_http = http is None
        self._http = http or httpx.AsyncClient(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
            verify=tls_context(),
        )

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool when this client created it."""
        if self._own_http:
            await self._http.aclose()

    async def get_json(self, path: str, timeout_s: float = 10.0) -> Any:
        """``GET base_url + path`` decoded as JSON; httpx errors and bad JSON propagate."""
        response = await self._http.get(self.base_url + path, timeout=timeout_s)
        response.raise_for_status()
        return response.json()

    async def served_models(self) -> list[str]:
        """Model ids listed by ``GET /v1/models``."""
        payload = await self.get_json("/v1/models")
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            raise BadInputError(self.base_url + "/v1/models", "expected {'data': [...]}")
        return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]

    async def stream(
        self,
        prompt: Prompt,
        *,
        request_id: str,
        max_tokens: int,
        options: RequestOptions | None = None,
        on_first_chunk: Callable[[], None] | None = None,
    ) -> StreamResult:
        """Send ``prompt`` once, streaming; never raises for server or network failures.

        ``on_first_chunk`` is called once, when the first chunk with choices arrives (the
        request has left the server's prefill), or when the request ends without one.

        A server that refuses ``continuous_usage_stats`` (HTTP 400 naming it, as strict OpenAI
        schemas do) gets the request again without it, and never again from this client
        (:attr:`continuous_usage_refused`).
        """
        options = options or RequestOptions()
        fired = on_first_chunk is None

        def first() -> None:
            nonlocal fired
            if not fired:
                fired = True
                on_first_chunk()  # type: ignore[misc]  # not None while fired is False

        if options.continuous_usage and self.continuous_usage_refused:
            options = dataclasses.replace(options, continuous_usage=False)
        result = await self._stream_once(prompt, request_id, max_tokens, options, first)
        error = result.record.error or ""
        if (
            options.continuous_usage
            and result.http_status == 400
            and "continuous_usage" in error.replace(" ", "_")
        ):
            self.continuous_usage_refused = True
            options = dataclasses.replace(options, continuous_usage=False)
            result = await self._stream_once(prompt, request_id, max_tokens, options, first)
        first()  # ended without a chunk: never leave a caller waiting
        return result

    async def _stream_once(
        self,
        prompt: Prompt,
        request_id: str,
        max_tokens: int,
        options: RequestOptions,
        on_first_chunk: Callable[[], None] | None = None,
    ) -> StreamResult:
        body = request_body(self.model, prompt, max_tokens, options)
        api = request_api(prompt, options)
        url = f"{self.base_url}/v1/{'chat/completions' if api == 'chat' else 'completions'}"
        chunks: list[StreamChunk] = []
        usage: dict[str, Any] = {}
        finish_reason: str | None = None
        status: int | None = None
        error: str | None = None
        send_time_s = time.perf_counter()
        try:
            async with self._http.stream(
                "POST", url, json=body, timeout=options.timeout_s
            ) as response:
                status = response.status_code
                if status != 200:
                    text = (await response.aread()).decode("utf-8", errors="replace")
                    error = f"HTTP {status}: {' '.join(text.split())[:_MAX_ERROR_BODY_CHARS]}"
                else:
                    done = False
                    async for line in response.aiter_lines():
                        arrived_s = time.perf_counter()
                        if not line.startswith("data:"):
                            continue  # blank separators, comments, event: lines
                        data = line[len("data:") :].strip()
                        if data == "[DONE]":
                            done = True
                            break
                        obj = json.loads(data)
                        if not isinstance(obj, dict):
                            raise ValueError(f"chunk is not a JSON object: {data[:80]}")
                        if "error" in obj:
                            error = f"server error in stream: {json.dumps(obj['error'])[:200]}"
                            break
                        choices = obj.get("choices") or []
                        if choices and on_first_chunk is not None:
                            on_first_chunk()
                            on_first_chunk = None  # once: not again on every chunk
                        text = ""
                        for choice in choices:
                            text += _chunk_text(choice, api)
                            finish_reason = choice.get("finish_reason") or finish_reason
                        if isinstance(obj.get("usage"), dict):
                            usage = obj["usage"]
                        chunks.append(
                            StreamChunk(
                                arrived_s,
                                text,
                                bool(choices),
                                _usage_int(obj.get("usage"), "completion_tokens"),
                            )
                        )
                    if not done and error is None:
                        error = "stream ended before [DONE]"
        except Exception as e:  # the load loop must go on: record, never raise
            error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        end_time_s = time.perf_counter()

        total = _usage_int(usage, "completion_tokens")
        try:
            counts, source = chunk_token_counts(chunks, total, self.count_tokens)
        except Exception as e:  # a failing count_tokens must not stop the run either
            counts, source = [0] * len(chunks), "chunks"
            error = error or f"token counting failed: {type(e).__name__}: {e}"
        prompt_tokens = _usage_int(usage, "prompt_tokens")
        if prompt_tokens is None:
            prompt_tokens = self._safe_count(prompt.text)
        first = next((c.time_s for c, n in zip(chunks, counts, strict=True) if n > 0), None)
        record = RequestRecord(
            request_id=request_id,
            category=prompt.category,
            send_time_s=send_time_s,
            first_token_time_s=first,
            chunk_times_s=tuple(c.time_s for c in chunks),
            chunk_token_counts=tuple(counts),
            end_time_s=end_time_s,
            prompt_tokens=prompt_tokens,
            output_tokens=total if total is not None else sum(counts),
            error=error,
        )
        return StreamResult(record, source, "".join(c.text for c in chunks), finish_reason, status)

    def _safe_count(self, text: str) -> int:
        if self.count_tokens is None:
            return 0
        try:
            return self.count_tokens(text)
        except Exception:  # an estimate only; 0 = unknown
            return 0
