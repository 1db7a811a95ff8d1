"""Request and response bodies of spectool's OpenAI-compatible HTTP API.

Requests are strict (``extra="forbid"``, no type coercion, finite numbers only), like
trtllm-serve's protocol models: a typo such as ``max_token`` is a 400 naming the field instead
of a silently ignored setting. Harmless OpenAI fields (``user``, neutral penalties, ``n=1``) are
accepted; features spectool does not implement (``n > 1``, ``logprobs``, penalties, tools) are
refused with a 400 naming the field. ``logprobs`` in particular: TensorRT-LLM rejects logprob
requests under speculative decoding, and so does spectool. The vLLM / trtllm-serve extensions
``top_k``, ``min_tokens``, ``ignore_eos``, ``stop_token_ids``, ``skip_special_tokens``,
``include_stop_str_in_output`` and ``return_token_ids`` are supported.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_serializer,
    model_validator,
)

# Stop strings per request: OpenAI allows 4; vLLM none; a cap keeps the per-token scan cheap.
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
LOGPROBS_REFUSED = (
    "spectool does not return logprobs (TensorRT-LLM refuses them under speculative decoding)"
)


class _Request(BaseModel):
    """Strict request base: unknown fields, wrong types and NaN/inf are validation errors."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Request):
    """``stream_options``: ``include_usage`` adds a final chunk with usage and no choices."""

    include_usage: bool | None = None
    # vLLM's extension: usage on every chunk, the only exact per-chunk token count under
    # speculation (one chunk can carry several accepted tokens).
    continuous_usage_stats: bool | None = None


class _GenerationRequest(_Request):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    n: int = 1
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_token_ids: bool = False

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError("only n=1 is supported")
        return value

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        for stop in stops:
            if not stop:
                raise ValueError("stop strings must not be empty")
            if len(stop) > MAX_STOP_STRING_CHARS:
                raise ValueError(f"stop strings are at most {MAX_STOP_STRING_CHARS} characters")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_additive_penalty(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("penalties are not supported (only 0)")
        return value

    @field_validator("repetition_penalty")
    @classmethod
    def _no_repetition_penalty(cls, value: float | None) -> float | None:
        if value is not None and value != 1.0:
            raise ValueError("repetition_penalty is not supported (only 1)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("logit_bias is not supported")
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _GenerationRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options is not None and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options is not None and self.stream_options.continuous_usage_stats)


class CompletionRequest(_GenerationRequest):
    """``POST /v1/completions``: one prompt (a string, or a list of token ids)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None
    logprobs: int | None = None
    add_special_tokens: bool = True

    @field_validator("prompt")
    @classmethod
    def _one_prompt(
        cls, value: str | list[str] | list[int] | list[list[int]]
    ) -> str | list[str] | list[int] | list[list[int]]:
        if isinstance(value, list):
            if not value:
                raise ValueError("prompt must not be empty")
            if isinstance(value[0], str | list) and len(value) != 1:
                raise ValueError("only one prompt per request is supported")
            if isinstance(value[0], list) and not value[0]:
                raise ValueError("prompt must not be empty")
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is not supported")
        return value

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise ValueError("only best_of=1 is supported")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix is not supported")
        return value

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError(LOGPROBS_REFUSED)
        return value

    def prompt_text_or_ids(self) -> str | list[int]:
        """The single prompt as text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return prompt
        first = prompt[0]
        if isinstance(first, str | list):
            return first
        return list(prompt)  # type: ignore[arg-type]


class TextContentPart(_Request):
    """A ``{"type": "text", "text": ...}`` content part (the only kind spectool accepts)."""

    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    """One conversation turn; list content is joined from its text parts."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseFormat(_Request):
    type: Literal["text"]


class ChatCompletionRequest(_GenerationRequest):
    """``POST /v1/chat/completions``: the prompt is the chat template applied to ``messages``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    add_generation_prompt: bool = True

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError(LOGPROBS_REFUSED)
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, value: int | None) -> int | None:
        if value:
            raise ValueError(LOGPROBS_REFUSED)
        return value

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if value:
            raise ValueError("tools are not supported")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_choice(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if value is not None and value != "none":
            raise ValueError("tool_choice is not supported (only 'none')")
        return value

    @property
    def output_limit(self) -> int | None:
        """``max_completion_tokens`` (OpenAI's current name) over the older ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens

    def message_dicts(self) -> list[dict[str, str]]:
        """Messages as the chat template expects them (plain ``role`` / ``content`` strings)."""
        out: list[dict[str, str]] = []
        for message in self.messages:
            item = {"role": message.role, "content": message.text()}
            if message.name is not None:
                item["name"] = message.name
            out.append(item)
        return out


# -- responses ---------------------------------------------------------------------------------


class _Response(BaseModel):
    """Response base: keys named in ``_omit_if_none`` are left out when None (extensions)."""

    _omit_if_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_unset_extensions(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        for key in self._omit_if_none:
            if data.get(key, 0) is None:
                del data[key]
        return data


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


def _now_s() -> int:
    return int(time.time())


def completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def chat_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


class CompletionChoice(_Response):
    _omit_if_none = frozenset({"token_ids"})

    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class CompletionResponse(_Response):
    """A non-streamed completion, or (``object`` = ``text_completion``) one streamed chunk.

    ``metrics``: vLLM's per-request extension, ``{"speculative_decoding": {...}}`` on the body
    or the final usage chunk of a speculating server (AIPerf reads it for acceptance).
    """

    _omit_if_none = frozenset({"usage", "prompt_token_ids", "metrics"})

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now_s)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None
    metrics: dict[str, Any] | None = None


class AssistantMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Response):
    _omit_if_none = frozenset({"token_ids"})

    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(_Response):
    _omit_if_none = frozenset({"prompt_token_ids", "metrics"})

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now_s)
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = None
    metrics: dict[str, Any] | None = None


class ChatDelta(_Response):
    _omit_if_none = frozenset({"role", "content"})

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Response):
    _omit_if_none = frozenset({"token_ids"})

    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(_Response):
    _omit_if_none = frozenset({"usage", "prompt_token_ids", "metrics"})

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now_s)
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None
    metrics: dict[str, Any] | None = None


class ModelCard(_Response):
    _omit_if_none = frozenset({"max_model_len", "description"})

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now_s)
    owned_by: str = "spectool"
    max_model_len: int | None = None
    description: str | None = None  # what the model is for, where a user could misread it


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(_Response):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(_Response):
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorInfo
