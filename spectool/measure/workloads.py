"""Prompt sets for load runs: built-in ones made from local Python sources, or a user's JSONL file.

Why not random tokens: acceptance of speculative decoding depends on the text. Random prompts
give meaningless acceptance rates (peers.md fact 9), so the built-in workload uses real text that
exists on every machine spectool runs on: the Python standard library's own sources.

Built-in categories (:data:`BUILTIN_CATEGORIES`), built by :func:`builtin_workload`:

* ``code``: a standard-library function's signature, docstring and first body lines; the model
  is asked to continue the function (code completion, where drafters accept most).
* ``summarization``: a module or class docstring; the model is asked to summarize it.
* ``qa``: a function's signature and docstring; the model answers a question about it.

Selection is deterministic for a given seed on a given Python installation (files are sorted,
then shuffled by ``random.Random(seed)``); a different Python version gives different text.

User files (Spec-Bench, OpenAI completions and chat request logs, ShareGPT conversations,
mooncake/AIPerf traces) are read by :mod:`spectool.measure.workload_files`.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import sysconfig
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectool.errors import BadInputError

BUILTIN_CATEGORIES: tuple[str, ...] = ("code", "summarization", "qa")
DEFAULT_CATEGORY = "default"

# Standard-library folders that are tests, vendored packages or tools, not library documentation.
_SKIP_PARTS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"}
)
_MAX_SOURCE_BYTES = 512 * 1024
_MAX_DOC_CHARS = 2400  # keeps a prompt within a few hundred tokens
_MIN_FUNCTION_DOC_CHARS = 60
_MIN_SUMMARY_DOC_CHARS = 400
_BODY_LINES = 3  # body lines shown after the docstring in a code prompt
_PER_FILE = 2  # at most this many prompts of one category from one file: variety
_QA_QUESTIONS: tuple[str, ...] = (
    "What does `{name}` do, according to its documentation?",
    "Which arguments does `{name}` take, and what is each one for?",
    "What does `{name}` return, and in which cases does it fail or raise an error?",
    "Give a short example of when a programmer would call `{name}`, and explain why.",
)


@dataclass(frozen=True)
class ChatMessage:
    """One message of a chat request (``content`` joined from its text parts)."""

    role: str
    content: str
    name: str | None = None

    def to_json(self) -> dict[str, str]:
        """The message as an OpenAI chat request writes it."""
        out = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        return out


@dataclass(frozen=True)
class Prompt:
    """One prompt of a workload.

    ``max_tokens`` is the prompt's own output length when its source gave one (prompt JSONL,
    request logs, ShareGPT answers, traces); None means the run's default output length
    applies. ``temperature``, ``top_p`` and ``stop`` are the prompt's own sampling settings (an
    OpenAI request log); None means the trial's request options apply. ``messages``: a chat
    request's messages, sent as a chat request (``text`` is then their rendering, what the
    server's chat template makes of them, used to count the prompt's tokens). ``arrival_s``:
    a trace's arrival time in seconds (its timestamp times ``--time-scale``), for a replay.
    """

    prompt_id: str
    category: str
    text: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] | None = None
    messages: tuple[ChatMessage, ...] | None = None
    arrival_s: float | None = None

    def sampling(self) -> dict[str, Any]:
        """The prompt's own sampling settings that are set (empty for older formats)."""
        fields = {"temperature": self.temperature, "top_p": self.top_p, "stop": self.stop}
        return {k: v for k, v in fields.items() if v is not None}

    def _identity_extra(self) -> dict[str, Any]:
        """What :func:`workload_id` adds to the four original fields: only what is set."""
        extra: dict[str, Any] = {
            k: list(v) if isinstance(v, tuple) else v for k, v in self.sampling().items()
        }
        if self.messages is not None:
            extra["messages"] = [m.to_json() for m in self.messages]
        if self.arrival_s is not None:
            extra["arrival_s"] = self.arrival_s
        return extra


def workload_id(prompts: Sequence[Prompt]) -> str:
    """A short content digest of ``prompts`` (order included): two runs with equal ids used the
    same prompts, so a resumed run can tell whether its saved trials still apply."""
    digest = hashlib.sha256()
    for p in prompts:
        fields: list[Any] = [p.prompt_id, p.category, p.text, p.max_tokens]
        extra = p._identity_extra()
        if extra:  # only when set: ids of older workloads (and their saved trials) stay valid
            fields.append(extra)
        line = json.dumps(fields, ensure_ascii=False)
        digest.update(line.encode("utf-8") + b"\n")
    return "sha256:" + digest.hexdigest()[:16]


# -- built-in workload ------------------------------------------------------------------------


def stdlib_dir() -> Path:
    """Folder of the running interpreter's standard-library sources."""
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files(root: Path) -> list[Path]:
    """Library ``*.py`` files under ``root`` in a stable order; tests and vendored trees pruned."""
    files: list[Path] = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _SKIP_PARTS]
        files.extend(
            Path(folder, n) for n in names if n.endswith(".py") and not n.startswith("test_")
        )
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _clip(text: str, limit: int = _MAX_DOC_CHARS) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit)
    return text[: cut if cut > limit // 2 else limit].rstrip()


def _function_head(source: str, node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """Source of the ``def`` line(s), docstring and the first body lines, dedented; None when
    the body is too short to leave something to complete."""
    lines = source.splitlines()
    doc_end = node.body[0].end_lineno
    end = node.end_lineno
    if doc_end is None or end is None or end - doc_end < 2 * _BODY_LINES:
        return None  # too little body left to continue
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    head = "\n".join(lines[first - 1 : doc_end + _BODY_LINES])
    if len(head) > _MAX_DOC_CHARS:
        return None
    return textwrap.dedent(head).rstrip()


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    return f"{prefix} {node.name}({ast.unparse(node.args)}){returns}"


def _definitions(
    body: list[ast.stmt], prefix: str = ""
) -> Iterator[tuple[str, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Classes and functions in source order with their qualified names (``Class.method``)."""
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            yield name, node
            yield from _definitions(node.body, f"{name}.")


def _prompts_from_file(root: Path, path: Path) -> dict[str, list[tuple[str, str]]]:
    """``category -> [(id suffix, prompt text)]`` for one source file (empty when unusable)."""
    found: dict[str, list[tuple[str, str]]] = {c: [] for c in BUILTIN_CATEGORIES}
    try:
        if path.stat().st_size > _MAX_SOURCE_BYTES:
            return found
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return found
    module = _module_name(root, path)

    doc = ast.get_docstring(tree)
    if doc and len(doc) >= _MIN_SUMMARY_DOC_CHARS:
        found["summarization"].append(
            (
                "module",
                f"Summarize the following documentation of the Python module `{module}` in "
                f"three sentences.\n\n{_clip(doc)}\n\nSummary:",
            )
        )
    for qualname, node in _definitions(tree.body):
        if isinstance(node, ast.ClassDef):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= _MIN_SUMMARY_DOC_CHARS:
                found["summarization"].append(
                    (
                        qualname,
                        f"Summarize the documentation of the class `{module}.{qualname}` in "
                        f"three sentences.\n\n{_clip(doc)}\n\nSummary:",
                    )
                )
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if not doc or len(doc) < _MIN_FUNCTION_DOC_CHARS or node.name.startswith("__"):
                continue
            head = _function_head(source, node)
            if head is not None:
                found["code"].append(
                    (
                        qualname,
                        f"Complete the following Python function from the standard-library "
                        f"module `{module}`. Reply with the code only.\n\n{head}\n",
                    )
                )
            question = _QA_QUESTIONS[len(found["qa"]) % len(_QA_QUESTIONS)]
            found["qa"].append(
                (
                    qualname,
                    f"Documentation of `{module}.{qualname}`:\n\n{_signature(node)}\n\n"
                    f"{_clip(doc)}\n\nQuestion: {question.format(name=node.name)}\nAnswer:",
                )
            )
    found["qa"].reverse()  # other functions than the code prompts of the same file
    return found


def builtin_workload(
    num_prompts: int,
    *,
    seed: int = 0,
    categories: Sequence[str] = BUILTIN_CATEGORIES,
    source_dir: Path | None = None,
) -> list[Prompt]:
    """``num_prompts`` prompts from the standard-library sources, categories interleaved.

    Prompt ``i`` has category ``categories[i % len(categories)]``. Files are visited in a
    seeded random order and each gives at most a couple of prompts per category, so prompts come
    from many modules. Deterministic for a given ``seed`` and ``source_dir`` (default: the
    running interpreter's standard library).
    """
    if num_prompts < 1:
        raise BadInputError("builtin workload", f"num_prompts must be >= 1, got {num_prompts}")
    unknown = [c for c in categories if c not in BUILTIN_CATEGORIES]
    if unknown or not categories:
        raise BadInputError(
            "builtin workload",
            f"categories must be a non-empty subset of {', '.join(BUILTIN_CATEGORIES)}; "
            f"got {', '.join(categories) or 'none'}",
        )
    cats = list(dict.fromkeys(categories))
    root = source_dir if source_dir is not None else stdlib_dir()
    files = _stdlib_files(root) if root.is_dir() else []
    if not files:
        raise BadInputError(
            root, "no Python standard-library sources found; pass a workload file instead"
        )
    random.Random(seed).shuffle(files)  # noqa: S311 (a reproducible sample, not a secret)
    need = {c: -(-num_prompts // len(cats)) for c in cats}  # ceil: enough for the interleave
    pools: dict[str, list[Prompt]] = {c: [] for c in cats}
    for path in files:
        if all(len(pools[c]) >= need[c] for c in cats):
            break
        for cat, items in _prompts_from_file(root, path).items():
            if cat not in pools:
                continue
            module = _module_name(root, path)
            for suffix, text in items[:_PER_FILE]:
                if len(pools[cat]) < need[cat]:
                    pools[cat].append(Prompt(f"{cat}:{module}:{suffix}", cat, text))
    short = [c for c in cats if len(pools[c]) < need[c]]
    if short:
        raise BadInputError(
            root,
            f"only {', '.join(f'{len(pools[c])} {c}' for c in short)} prompts could be made "
            f"from the sources, {num_prompts} asked; pass a workload file instead",
        )
    return [pools[cats[i % len(cats)]][i // len(cats)] for i in range(num_prompts)]
