"""Records of public benchmark formats as prompts: ShareGPT conversations and mooncake traces.

**ShareGPT** (``{"conversations": [{"from": "human" | "gpt", "value": str}, ...]}``), read as
vLLM's benchmark loader reads it (``vllm-project/vllm``, ``vllm/benchmarks/datasets.py``,
``ShareGPTDataset``, commit 0056b87fc1fda2642f39dda4392824c425dd1638): the question is sent as
the prompt and the reference answer's length is the request's output length. vLLM takes turns 0
and 1 and skips conversations of fewer than two turns; here the question is the first ``human``
(or ``user``) turn and the answer the first ``gpt`` (or ``assistant``, ``chatgpt``, ``bard``,
``bing``) turn after it, and a conversation without both, or with an empty one, is skipped and
counted. The answer is counted with the target's tokenizer (words without one). vLLM's further
length filters (4 to 1024 prompt tokens) are not applied: tune drops only what does not fit the
server's sequence limit.

**Trace** rows (``{"timestamp": ms, "input_length": int, "output_length": int, "hash_ids"?:
[int, ...]}``), the mooncake format as AIPerf reads it (``ai-dynamo/aiperf``,
``src/aiperf/dataset/loader/models.py`` ``MooncakeTrace`` at commit
0109a64e75c3f43aa02bc1ce29f66deb16f57bda; ``src/aiperf/dataset/generator/prompt.py``
``PromptGenerator._build_token_sequence`` at 01da14a4ea990cb488225d6392cf87d384de7d51). The
prompt is synthesised to exactly ``input_length`` tokens of the target's tokenizer (words
without one). As in AIPerf, ``hash_ids[i]`` names block ``i`` of :data:`TRACE_BLOCK_TOKENS`
tokens, the last block holds the rest (1 to a block's tokens, else an error), and a hash id's
text is the same wherever it appears, so rows sharing leading hash ids share a prefix (a
shorter last block is a prefix of the full one). A row without ``hash_ids`` gets text of its
own. ``output_length`` becomes the request's ``max_tokens`` and ``timestamp`` (ms) times the
time scale the prompt's ``arrival_s`` (seconds), for a replay; timestamps must not go
backwards. A row may give ``text_input`` (the literal prompt, as AIPerf sends it) instead of
``input_length``; AIPerf's other trace fields (``messages``, ``payload``, ``session_id``,
``delay``) are refused.

The synthetic text is common English words drawn at random (seeded by the hash id or the
row): it carries the trace's lengths and prefix sharing, not its users' text, so speculative
acceptance measured on it is not theirs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectool.errors import BadInputError
from spectool.measure.workloads import DEFAULT_CATEGORY, Prompt

TRACE_BLOCK_TOKENS = 512  # AIPerf's default block size for hash_ids
_QUESTION_ROLES = frozenset({"human", "user"})
_ANSWER_ROLES = frozenset({"gpt", "assistant", "chatgpt", "bard", "bing"})
_TRACE_KEYS = ("timestamp", "input_length", "output_length")
# Filler words of synthesised prompts: those the target's tokenizer reads as one token each,
# with or without a leading space, are used, so N words are N tokens.
_WORDS: tuple[str, ...] = tuple(
    """the of and to in is it that for on with as was at by be this are from or have an they
    which one you were all we can her has there been if more when will would who so no out up
    into than them only other new some could these two may first then do any like my now over
    such our man me even most made after also did many before must through back years where
    much your way well down should because each just those people how too little state good
    very make world still own see men work long get here between both life being under never
    day same another know while last might us great old year off come since against go came
    right used take three house water small place found part name word line time number light
    read write open close begin end point city tree river field stone paper music color plan
    a b c d e f g h i j k l m n o p q r s t u v w x y z""".split()
)

CountTokens = Callable[[str], int]


@dataclass(frozen=True)
class Where:
    """A record's place, for errors: ``line N`` of JSON Lines, ``entry N`` of a JSON list."""

    path: Path
    label: str
    number: int

    def bad(self, problem: str) -> BadInputError:
        return BadInputError(self.path, f"{self.label}: {problem}")


def _length(text: str, count_tokens: CountTokens | None) -> int:
    return count_tokens(text) if count_tokens is not None else len(text.split())


def sharegpt_prompt(
    where: Where, obj: Mapping[str, Any], count_tokens: CountTokens | None
) -> Prompt | None:
    """The conversation's question with its answer's length; None when it has no question or
    no answer (skipped, as vLLM skips them)."""
    conversation = obj["conversations"]
    if not isinstance(conversation, list):
        raise where.bad("'conversations' must be a list of {'from', 'value'} turns")
    turns: list[tuple[str, str]] = []
    for i, turn in enumerate(conversation, start=1):
        if (
            not isinstance(turn, dict)
            or not isinstance(turn.get("from"), str)
            or not isinstance(turn.get("value"), str)
        ):
            raise where.bad(f"turn {i} must be an object with string 'from' and 'value'")
        turns.append((turn["from"], turn["value"]))
    asked = next((i for i, (who, _) in enumerate(turns) if who in _QUESTION_ROLES), None)
    if asked is None or not turns[asked][1].strip():
        return None
    answer = next((text for who, text in turns[asked + 1 :] if who in _ANSWER_ROLES), None)
    if answer is None or not answer.strip():
        return None
    output_tokens = _length(answer, count_tokens)
    if output_tokens < 1:
        return None
    own_id = obj.get("id")
    prompt_id = (
        str(own_id)
        if isinstance(own_id, (str, int)) and not isinstance(own_id, bool)
        else f"{where.path.stem}:{where.number}"
    )
    return Prompt(prompt_id, DEFAULT_CATEGORY, turns[asked][1], output_tokens)


def _whole(where: Where, obj: Mapping[str, Any], key: str) -> int:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise where.bad(f"{key!r} must be an integer >= 1, got {value!r}")
    return value


class Trace:
    """Reads trace rows in file order: checks the timestamps' order, synthesises the prompts."""

    def __init__(
        self,
        count_tokens: CountTokens | None,
        time_scale: float = 1.0,
        block_tokens: int = TRACE_BLOCK_TOKENS,
    ) -> None:
        self.count_tokens = count_tokens
        self.time_scale = time_scale
        self.block_tokens = block_tokens
        self._last: tuple[float, str] | None = None  # the previous row's timestamp and place
        self._pool: tuple[str, ...] | None = None

    def words(self) -> tuple[str, ...]:
        """The filler words, each one token of the target's tokenizer (all without one)."""
        if self._pool is None:
            count = self.count_tokens
            pool = _WORDS
            if count is not None:
                pool = tuple(w for w in _WORDS if count(w) == 1 and count(" " + w) == 1)
            if not pool:
                raise BadInputError(
                    "trace workload",
                    "the target's tokenizer reads no filler word as one token; prompts of exact "
                    "token lengths cannot be synthesised with it",
                )
            self._pool = pool
        return self._pool

    def _stream(self, seed: str, n: int) -> list[str]:
        """The first ``n`` words of the text seeded by ``seed`` (a longer one extends it)."""
        rng = random.Random(seed)  # noqa: S311 (reproducible filler, not a secret)
        pool = self.words()
        return [pool[rng.randrange(len(pool))] for _ in range(n)]

    def _text(self, where: Where, input_length: int, hash_ids: list[int]) -> str:
        if not hash_ids:
            return " ".join(self._stream(f"row:{where.path.stem}:{where.number}", input_length))
        block = self.block_tokens
        last = input_length - (len(hash_ids) - 1) * block
        if not 1 <= last <= block:
            raise where.bad(
                f"'input_length' {input_length} does not fit {len(hash_ids)} hash_ids blocks of "
                f"{block} tokens: the last block must hold 1 to {block} tokens (as in AIPerf)"
            )
        words: list[str] = []
        for i, hash_id in enumerate(hash_ids):
            words += self._stream(f"block:{hash_id}", last if i == len(hash_ids) - 1 else block)
        return " ".join(words)

    def prompt(self, where: Where, obj: Mapping[str, Any]) -> Prompt:
        """The row's synthesised prompt, output length and arrival time."""
        unknown = sorted(set(obj) - {*_TRACE_KEYS, "text_input", "hash_ids"})
        if unknown:
            raise where.bad(
                f"unsupported key(s) {', '.join(map(repr, unknown))}; a trace row has "
                "'timestamp' (ms), 'input_length' or 'text_input', 'output_length' and optional "
                "'hash_ids'"
            )
        if ("input_length" in obj) == ("text_input" in obj):
            raise where.bad("a trace row needs one of 'input_length' and 'text_input'")
        missing = [key for key in ("timestamp", "output_length") if key not in obj]
        if missing:
            raise where.bad(f"a trace row needs {', '.join(map(repr, missing))}")
        timestamp = obj["timestamp"]
        if (
            isinstance(timestamp, bool)
            or not isinstance(timestamp, (int, float))
            or not math.isfinite(timestamp)
            or timestamp < 0
        ):
            raise where.bad(f"'timestamp' must be a number of ms >= 0, got {timestamp!r}")
        if self._last is not None and timestamp < self._last[0]:
            raise where.bad(
                f"timestamp {timestamp:g} ms is before {self._last[1]}'s {self._last[0]:g} ms: a "
                "trace lists requests in arrival order"
            )
        self._last = (float(timestamp), where.label)
        output_length = _whole(where, obj, "output_length")
        arrival_s = timestamp / 1000.0 * self.time_scale
        name = f"{where.path.stem}:{where.number}"
        if "text_input" in obj:  # the exact text instead of a length, as AIPerf 0.13 reads a
            # mooncake_trace row (aiperf/dataset/loader/models.py MooncakeTrace.text_input)
            text = obj["text_input"]
            if not isinstance(text, str) or not text:
                raise where.bad("'text_input' must be a non-empty string")
            if "hash_ids" in obj:
                raise where.bad("'hash_ids' shape synthesised text; 'text_input' is given")
            return Prompt(name, DEFAULT_CATEGORY, text, output_length, arrival_s=arrival_s)
        input_length = _whole(where, obj, "input_length")
        hash_ids = obj.get("hash_ids")
        hash_ids = [] if hash_ids is None else hash_ids  # optional, as in AIPerf
        if not isinstance(hash_ids, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) for h in hash_ids
        ):
            raise where.bad("'hash_ids' must be a list of integers")
        text = self._text(where, input_length, hash_ids)
        if self.count_tokens is not None and (got := self.count_tokens(text)) != input_length:
            raise where.bad(
                f"the synthesised prompt is {got} tokens, not {input_length}: the target's "
                "tokenizer merges words across spaces, so exact lengths cannot be synthesised"
            )
        return Prompt(name, DEFAULT_CATEGORY, text, output_length, arrival_s=arrival_s)
