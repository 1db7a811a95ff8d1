"""A user's workload file: its format, told by its content, and its records as prompts.

A file is JSON Lines (one object per line, blank lines ignored) or one JSON list of objects (a
file whose first non-blank character is ``[``, as ShareGPT dumps are). Every record names its
format by a key no other format has; all records of a file must be of one format:

==============  ==================  ===========================================================
format          key                 a record is
==============  ==================  ===========================================================
``prompts``     ``prompt``          ``{"prompt", "max_tokens"?, "category"?}``, or an OpenAI
                                    ``/v1/completions`` request body
``chat``        ``messages``        an OpenAI ``/v1/chat/completions`` request body
``spec-bench``  ``turns``           a Spec-Bench ``question.jsonl`` line
``sharegpt``    ``conversations``   a ShareGPT conversation
``trace``       ``input_length``    a mooncake / AIPerf trace row (also told by ``timestamp``,
                                    ``output_length``, ``hash_ids`` or ``text_input`` alone)
==============  ==================  ===========================================================

Request bodies (``prompts``, ``chat``) keep their own ``max_tokens`` (or
``max_completion_tokens``), ``temperature``, ``top_p`` and ``stop``; ``model``, ``stream``,
``stream_options``, ``seed`` and ``user`` are ignored, ``n`` other than 1 is refused, any other
key is refused. A chat request is sent as a chat request, so the server renders its messages
with its own chat template; ``text`` is that rendering (``render_chat``: the target's template,
else :func:`spectool.engine.tokenizer.plain_chat_text`, the embedded server's rendering without
one), which is what the prompt's tokens are counted on. ShareGPT and traces:
:mod:`spectool.measure.workload_datasets`.

Every bad record is a :class:`BadInputError` naming the file and ``line N`` (``entry N`` in a
JSON list); a missing or impossible field is an error, never a default.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectool.constants import MAX_JSON_BYTES
from spectool.errors import BadInputError
from spectool.measure.workload_datasets import Trace, Where, sharegpt_prompt
from spectool.measure.workloads import DEFAULT_CATEGORY, ChatMessage, Prompt

FORMATS: tuple[str, ...] = ("prompts", "chat", "spec-bench", "sharegpt", "trace")
_FORMAT_OF_KEY = {
    "prompt": "prompts",
    "messages": "chat",
    "turns": "spec-bench",
    "conversations": "sharegpt",
    "input_length": "trace",
}
_TRACE_ONLY_KEYS = ("timestamp", "output_length", "hash_ids", "text_input")
_WHAT = {
    "prompts": "prompt line",
    "chat": "chat request",
    "spec-bench": "Spec-Bench question",
    "sharegpt": "ShareGPT conversation",
    "trace": "trace row",
}
_REQUEST_KEYS = frozenset(
    {"category", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop"}
)
# Keys of an OpenAI request that do not change what is generated: ignored ('n' must be 1).
_IGNORED_OPENAI_KEYS = frozenset({"model", "stream", "stream_options", "seed", "user", "n"})
_CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})  # as the server
_MAX_STOPS = 4

RenderChat = Callable[[Sequence[Mapping[str, str]]], str]
CountTokens = Callable[[str], int]


@dataclass(frozen=True)
class WorkloadFile:
    """The prompts of a file, its format and how many records were skipped (ShareGPT
    conversations without a question or an answer, skipped as vLLM's loader does)."""

    prompts: tuple[Prompt, ...]
    format: str
    skipped: int = 0


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise BadInputError(path, "workload file not found")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise BadInputError(path, f"larger than the {MAX_JSON_BYTES} bytes allowed")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BadInputError(path, f"cannot be read as UTF-8 text: {e}") from e


def _records(path: Path) -> Iterator[tuple[Where, Any]]:
    """Every record of the file with its place (see the module docstring)."""
    text = _read_text(path)
    if text.lstrip().startswith("["):
        try:
            entries = json.loads(text)
        except json.JSONDecodeError as e:
            raise BadInputError(path, f"line {e.lineno}: not valid JSON: {e.msg}") from e
        for number, obj in enumerate(entries, start=1):
            yield Where(path, f"entry {number}", number), obj
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise BadInputError(path, f"line {number}: not valid JSON: {e.msg}") from e
        yield Where(path, f"line {number}", number), obj


def record_format(where: Where, obj: Any) -> str:
    """The format a record names by its keys (module docstring); a BadInputError when it names
    none, or more than one."""
    if not isinstance(obj, dict):
        raise where.bad("expected a JSON object")
    found = [(key, fmt) for key, fmt in _FORMAT_OF_KEY.items() if key in obj]
    if len(found) > 1:
        keys = " and ".join(repr(key) for key, _ in found)
        raise where.bad(f"has {keys}, keys of different formats; a record is of one format")
    if found:
        return found[0][1]
    if any(key in obj for key in _TRACE_ONLY_KEYS):
        return "trace"
    raise where.bad(
        "expected a prompt line ('prompt'), a chat request ('messages'), Spec-Bench keys "
        "('question_id', 'category', 'turns'), a ShareGPT conversation ('conversations') or "
        "a trace row ('timestamp', 'input_length', 'output_length')"
    )


def detect_format(path: str | Path) -> str:
    """The format of a workload file: that of its first record."""
    path = Path(path)
    for where, obj in _records(path):
        return record_format(where, obj)
    raise BadInputError(path, "no prompts in the file")


def _category(where: Where, obj: Mapping[str, Any]) -> str:
    category = obj.get("category", DEFAULT_CATEGORY)
    if not isinstance(category, str) or not category.strip():
        raise where.bad("'category' must be a non-empty string")
    return category


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _request_prompt(where: Where, obj: Mapping[str, Any], main_key: str, text: str) -> Prompt:
    """A request body's prompt with its own output length and sampling settings."""
    unknown = sorted(set(obj) - {main_key} - _REQUEST_KEYS - _IGNORED_OPENAI_KEYS)
    if unknown:
        raise where.bad(
            f"unknown key(s) {', '.join(map(repr, unknown))}; a {_WHAT[_FORMAT_OF_KEY[main_key]]} "
            f"has {main_key!r}, optional 'max_tokens' (or 'max_completion_tokens'), 'category', "
            "'temperature', 'top_p', 'stop'"
        )
    if obj.get("n", 1) != 1:
        raise where.bad(f"'n' must be 1 (one completion per request), got {obj['n']!r}")
    if "max_tokens" in obj and "max_completion_tokens" in obj:
        raise where.bad("give 'max_tokens' or 'max_completion_tokens', not both")
    max_tokens = obj.get("max_tokens", obj.get("max_completion_tokens"))
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise where.bad(f"'max_tokens' must be an integer >= 1, got {max_tokens!r}")
    temperature = obj.get("temperature")
    if temperature is not None and (not _is_number(temperature) or not 0 <= temperature <= 2):
        raise where.bad(f"'temperature' must be a number in [0, 2], got {temperature!r}")
    top_p = obj.get("top_p")
    if top_p is not None and (not _is_number(top_p) or not 0 < top_p <= 1):
        raise where.bad(f"'top_p' must be a number in (0, 1], got {top_p!r}")
    stop = obj.get("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if stops is not None and (
        not isinstance(stops, list)
        or len(stops) > _MAX_STOPS
        or not all(isinstance(x, str) and x for x in stops)
    ):
        raise where.bad(f"'stop' must be a non-empty string or a list of at most {_MAX_STOPS}")
    return Prompt(
        f"{where.path.stem}:{where.number}",
        _category(where, obj),
        text,
        max_tokens,
        None if temperature is None else float(temperature),
        None if top_p is None else float(top_p),
        None if stops is None else tuple(stops),
    )


def _completion_prompt(where: Where, obj: Mapping[str, Any]) -> Prompt:
    prompt = obj["prompt"]
    if not isinstance(prompt, str) or not prompt.strip():
        raise where.bad("'prompt' must be a non-empty string")
    return _request_prompt(where, obj, "prompt", prompt)


def _chat_message(where: Where, index: int, message: Any) -> ChatMessage:
    def bad(problem: str) -> BadInputError:
        return where.bad(f"message {index}: {problem}")

    if not isinstance(message, dict):
        raise bad("expected an object with 'role' and 'content'")
    unknown = sorted(set(message) - {"role", "content", "name"})
    if unknown:
        raise bad(f"unsupported key(s) {', '.join(map(repr, unknown))} (text messages only)")
    role = message.get("role")
    if role not in _CHAT_ROLES:
        raise bad(f"'role' must be one of {', '.join(sorted(_CHAT_ROLES))}, got {role!r}")
    content = message.get("content")
    if isinstance(content, list):
        parts = [
            p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None
            for p in content
        ]
        if not all(isinstance(p, str) for p in parts):
            raise bad("list 'content' must hold {'type': 'text', 'text': str} parts only")
        content = "".join(parts)  # type: ignore[arg-type]
    if not isinstance(content, str):
        raise bad("'content' must be a string or a list of text parts")
    name = message.get("name")
    if name is not None and not isinstance(name, str):
        raise bad("'name' must be a string")
    return ChatMessage(role, content, name)


def _chat_prompt(where: Where, obj: Mapping[str, Any], render_chat: RenderChat) -> Prompt:
    messages = obj["messages"]
    if not isinstance(messages, list) or not messages:
        raise where.bad("'messages' must be a non-empty list of {'role', 'content'} objects")
    turns = tuple(_chat_message(where, i, m) for i, m in enumerate(messages, start=1))
    try:
        text = render_chat([m.to_json() for m in turns])
    except BadInputError as e:
        raise where.bad(e.problem) from e
    prompt = _request_prompt(where, obj, "messages", text)
    return dataclasses.replace(prompt, messages=turns)


def _spec_bench_prompt(where: Where, obj: Mapping[str, Any]) -> Prompt:
    turns = obj["turns"]
    if not isinstance(turns, list) or not turns:
        raise where.bad("'turns' must be a non-empty list of strings")
    first = turns[0]
    if not isinstance(first, str) or not first.strip():
        raise where.bad("the first turn must be a non-empty string")
    for key in ("question_id", "category"):
        if key not in obj:
            raise where.bad(f"missing {key!r} (a Spec-Bench question has one)")
    qid = obj["question_id"]
    if isinstance(qid, bool) or not isinstance(qid, (int, str)):
        raise where.bad(f"'question_id' must be an integer or a string, got {qid!r}")
    return Prompt(str(qid), _category(where, obj), first)


def _plain_chat(messages: Sequence[Mapping[str, str]]) -> str:
    from spectool.engine.tokenizer import plain_chat_text

    return plain_chat_text(messages)


def read_workload(
    path: str | Path,
    *,
    count_tokens: CountTokens | None = None,
    render_chat: RenderChat | None = None,
    time_scale: float | None = None,
) -> WorkloadFile:
    """Every prompt of a workload file, in file order (see the module docstring).

    ``count_tokens`` (the target's tokenizer) counts ShareGPT answers and sizes synthesised trace
    prompts (words without it). ``render_chat``: the target's chat template. ``time_scale``
    multiplies a trace's timestamps; it is refused for other formats.
    """
    path = Path(path)
    if time_scale is not None and not time_scale > 0:
        raise BadInputError("--time-scale", f"must be > 0, got {time_scale}")
    fmt: str | None = None
    first: Where | None = None
    prompts: list[Prompt] = []
    skipped = 0
    trace = Trace(count_tokens, time_scale or 1.0)
    for where, obj in _records(path):
        kind = record_format(where, obj)
        if fmt is None:
            fmt, first = kind, where
        elif kind != fmt:
            assert first is not None
            raise where.bad(
                f"a {_WHAT[kind]} in a file of {_WHAT[fmt]}s ({first.label} is one); "
                "one format per file"
            )
        if kind == "prompts":
            prompt: Prompt | None = _completion_prompt(where, obj)
        elif kind == "chat":
            prompt = _chat_prompt(where, obj, render_chat or _plain_chat)
        elif kind == "spec-bench":
            prompt = _spec_bench_prompt(where, obj)
        elif kind == "sharegpt":
            prompt = sharegpt_prompt(where, obj, count_tokens)
        else:
            prompt = trace.prompt(where, obj)
        if prompt is None:
            skipped += 1
        else:
            prompts.append(prompt)
    if fmt is None:
        raise BadInputError(path, "no prompts in the file")
    if time_scale is not None and fmt != "trace":
        raise BadInputError(
            "--time-scale",
            f"scales a trace's timestamps, and {path} holds {_WHAT[fmt]}s, not trace rows",
        )
    if not prompts:
        raise BadInputError(
            path, f"no prompts in the file: none of its {skipped} conversations has an answer"
        )
    return WorkloadFile(tuple(prompts), fmt, skipped)


def load_workload_file(path: str | Path) -> list[Prompt]:
    """The prompts of a workload file (:func:`read_workload` without a tokenizer)."""
    return list(read_workload(path).prompts)
