"""The prompts of one tune run: the built-in workload or a file, fitted to the server's length limit.

A prompt only measures decoding if the server accepts it: prompt tokens plus its output tokens
(its own ``max_tokens``, else the run's) plus one verify step's drafts must fit the server's
sequence limit. Prompts that do not fit are dropped (counted, and said in the report), never
truncated: a cut prompt is a different prompt. Workload files are read by
:func:`spectool.measure.workload_files.read_workload` (format detected from the content). The built-in workload (:func:`spectool.measure.workloads.builtin_workload`,
Python standard-library text) is drawn larger until enough prompts fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from spectool.errors import BadInputError
from spectool.measure.workload_files import RenderChat, read_workload
from spectool.measure.workloads import Prompt, builtin_workload, workload_id

BUILTIN = "builtin"
_MAX_BUILTIN_DRAWS = 6  # the built-in draw doubles at most this many times


@dataclass(frozen=True)
class TunePrompts:
    """The prompts used, where they came from, and how many were dropped as too long.

    ``max_prompt_tokens`` is the longest prompt allowed with the run's output length (None: no
    tokenizer to count with, nothing dropped). ``format``: the file's format
    (:data:`spectool.measure.workload_files.FORMATS`) or ``builtin``; ``skipped``: records the
    file reader skipped (ShareGPT conversations without an answer).
    """

    prompts: tuple[Prompt, ...]
    source: str
    dropped: int
    max_prompt_tokens: int | None
    format: str = BUILTIN
    skipped: int = 0

    @property
    def workload_id(self) -> str:
        return workload_id(self.prompts)

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "format": self.format,
            "id": self.workload_id,
            "prompts": len(self.prompts),
            "dropped_too_long": self.dropped,
            "dropped_without_answer": self.skipped,
            "max_prompt_tokens": self.max_prompt_tokens,
        }


def _fitting(
    prompts: list[Prompt],
    count_tokens: Callable[[str], int] | None,
    limit: int | None,
    output_tokens: int | None = None,
) -> list[Prompt]:
    """The prompts within ``limit`` tokens; with ``output_tokens`` (the run's output length, that
    ``limit`` leaves room for) a prompt with its own ``max_tokens`` gets the limit moved by the
    difference."""
    if count_tokens is None or limit is None:
        return prompts

    def room(p: Prompt) -> int:
        if output_tokens is None or p.max_tokens is None:
            return limit
        return limit + output_tokens - p.max_tokens

    return [p for p in prompts if count_tokens(p.text) + 1 <= room(p)]  # +1: a BOS token


def output_range(mean: int) -> tuple[int, int]:
    """The built-in workload's output lengths around ``mean``: ``mean -+ mean // 2`` (at least
    2 tokens, so every request has a decode step)."""
    return max(2, mean - mean // 2), mean + mean // 2


def output_lengths(count: int, mean: int, seed: int) -> list[int]:
    """``count`` output lengths drawn uniformly from :func:`output_range` (seeded).

    Why: requests of one length start and finish together in a closed loop, so the baseline's
    batch runs in lockstep and no arriving request's prefill ever stalls another's decoding;
    users' traffic is never like that, and it tilts users' time per token against speculation.
    """
    import numpy as np

    low, high = output_range(mean)
    rng = np.random.default_rng([seed, 17])
    return [int(n) for n in rng.integers(low, high + 1, size=count)]


def tune_prompts(
    workload: Path | None,
    needed: int,
    *,
    count_tokens: Callable[[str], int] | None,
    max_prompt_tokens: int | None,
    seed: int = 0,
    mean_output: int | None = None,
    output_tokens: int | None = None,
    render_chat: RenderChat | None = None,
    time_scale: float | None = None,
) -> TunePrompts:
    """``needed`` built-in prompts that fit, or every fitting prompt of ``workload``.

    ``mean_output``: give the built-in prompts output lengths varied around it
    (:func:`output_lengths`); ``max_prompt_tokens`` must then leave room for the longest.
    ``output_tokens``: the run's output length ``max_prompt_tokens`` leaves room for, so that a
    file's prompts with their own lengths are fitted with theirs. ``render_chat`` and
    ``time_scale`` go to :func:`~spectool.measure.workload_files.read_workload` (a
    ``time_scale`` without a trace file is a BadInputError).

    :class:`BadInputError` when no prompt of the file fits, or the built-in workload cannot
    give ``needed`` fitting prompts.
    """
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise BadInputError(
            "--max-tokens", "leaves no room for a prompt within the server's sequence limit"
        )
    if workload is None and time_scale is not None:
        raise BadInputError(
            "--time-scale", "scales a trace's timestamps; pass the trace as --workload"
        )
    if workload is not None:
        read = read_workload(
            workload, count_tokens=count_tokens, render_chat=render_chat, time_scale=time_scale
        )
        kept = _fitting(list(read.prompts), count_tokens, max_prompt_tokens, output_tokens)
        if not kept:
            raise BadInputError(
                workload,
                f"no prompt fits the server's sequence limit with its output "
                f"({max_prompt_tokens} prompt tokens with the run's output length; lower "
                "--max-tokens or raise --max-seq-len)",
            )
        dropped = len(read.prompts) - len(kept)
        return TunePrompts(
            tuple(kept), str(workload), dropped, max_prompt_tokens, read.format, read.skipped
        )
    # A larger draw starts with the same prompts as a smaller one (same files, same order).
    draw = needed
    for _ in range(_MAX_BUILTIN_DRAWS):
        try:
            drawn = builtin_workload(draw, seed=seed)
        except BadInputError:
            break  # the standard library ran out of prompts of some category
        kept: list[Prompt] = []
        dropped = 0
        for prompt in drawn:
            if len(kept) == needed:
                break
            if _fitting([prompt], count_tokens, max_prompt_tokens):
                kept.append(prompt)
            else:
                dropped += 1
        if len(kept) == needed:
            if mean_output is not None:
                lengths = output_lengths(needed, mean_output, seed)
                kept = [replace(p, max_tokens=n) for p, n in zip(kept, lengths, strict=True)]
            return TunePrompts(tuple(kept), BUILTIN, dropped, max_prompt_tokens)
        draw *= 2
    raise BadInputError(
        "built-in workload",
        f"fewer than {needed} prompts fit the server's limit of {max_prompt_tokens} prompt tokens "
        "(lower --max-tokens, raise --max-seq-len, or pass --workload)",
    )
