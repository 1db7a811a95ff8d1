"""Built-in prompt sets from Python sources, and user workload files (Spec-Bench, prompt JSONL)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectool.errors import BadInputError
from spectool.measure.workload_files import load_workload_file
from spectool.measure.workloads import (
    BUILTIN_CATEGORIES,
    Prompt,
    builtin_workload,
    workload_id,
)

MODULE_DOC = "Tools for frobnicating widgets. " * 20  # >= 400 characters: a summary prompt


def _write_library(root: Path) -> Path:
    """A tiny 'standard library': one module with a module docstring and a documented function,
    plus a test folder that must be ignored."""
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "widgets.py").write_text(
        f'"""{MODULE_DOC}"""\n\n\n'
        "def frobnicate(widget, times=2):\n"
        '    """Frobnicate ``widget`` a number of times and return the frobnicated widget.\n\n'
        "    Raises ValueError when times is negative.\n"
        '    """\n'
        "    if times < 0:\n"
        "        raise ValueError(times)\n"
        "    result = widget\n"
        "    for _ in range(times):\n"
        "        result = result.frob()\n"
        "    log(result)\n"
        "    check(result)\n"
        "    return result\n"
    )
    (root / "test").mkdir()
    (root / "test" / "helpers.py").write_text(f'"""{MODULE_DOC}"""\n')
    return root


def test_builtin_workload_is_deterministic_and_interleaves_categories() -> None:
    first = builtin_workload(12, seed=3)
    again = builtin_workload(12, seed=3)
    other = builtin_workload(12, seed=4)
    assert first == again
    assert workload_id(first) == workload_id(again)
    assert first != other and workload_id(first) != workload_id(other)
    assert [p.category for p in first] == list(BUILTIN_CATEGORIES) * 4
    assert len({p.prompt_id for p in first}) == 12
    for p in first:
        assert p.max_tokens is None and p.text.strip()
        if p.category == "code":
            assert "def " in p.text and '"""' in p.text
        elif p.category == "qa":
            assert "\nQuestion: " in p.text and p.text.endswith("Answer:")
        else:
            assert p.text.startswith("Summarize") and p.text.endswith("Summary:")


def test_builtin_workload_subset_of_categories() -> None:
    prompts = builtin_workload(4, seed=0, categories=["qa"])
    assert {p.category for p in prompts} == {"qa"}
    with pytest.raises(BadInputError, match="categories"):
        builtin_workload(4, categories=["poetry"])
    with pytest.raises(BadInputError, match="num_prompts"):
        builtin_workload(0)


def test_builtin_prompts_are_made_from_the_sources(tmp_path: Path) -> None:
    root = _write_library(tmp_path / "lib")
    code, summary, qa = builtin_workload(3, seed=0, source_dir=root)
    assert code.prompt_id == "code:pkg.widgets:frobnicate"
    # Signature, docstring and the first three body lines; the rest is left to complete.
    assert "def frobnicate(widget, times=2):\n" in code.text
    assert "        raise ValueError(times)\n    result = widget\n" in code.text
    assert "for _ in range" not in code.text
    assert summary.prompt_id == "summarization:pkg.widgets:module"
    assert MODULE_DOC.strip() in summary.text and "`pkg.widgets`" in summary.text
    assert "def frobnicate(widget, times=2)" in qa.text
    assert "Raises ValueError when times is negative." in qa.text
    # The test folder is never read: its module docstring would be a second summary.
    with pytest.raises(BadInputError, match="only 1 code, 1 summarization, 1 qa prompts"):
        builtin_workload(6, seed=0, source_dir=root)


def test_builtin_workload_without_sources(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="no Python standard-library sources"):
        builtin_workload(3, source_dir=tmp_path)


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_spec_bench_file_uses_the_first_turn(tmp_path: Path) -> None:
    path = _write_lines(
        tmp_path / "question.jsonl",
        [
            json.dumps(
                {
                    "question_id": 81,
                    "category": "writing",
                    "turns": ["Write a travel blog post.", "Rewrite it in limericks."],
                    "reference": ["ignored"],
                }
            ),
            "",
            json.dumps({"question_id": "q2", "category": "math_reasoning", "turns": ["2+2?"]}),
        ],
    )
    assert load_workload_file(path) == [
        Prompt("81", "writing", "Write a travel blog post."),
        Prompt("q2", "math_reasoning", "2+2?"),
    ]


def test_prompt_file_with_lengths_and_default_category(tmp_path: Path) -> None:
    path = _write_lines(
        tmp_path / "mine.jsonl",
        [
            json.dumps({"prompt": "Say hi.", "max_tokens": 7, "category": "chat"}),
            json.dumps({"prompt": "Count to ten."}),
        ],
    )
    assert load_workload_file(path) == [
        Prompt("mine:1", "chat", "Say hi.", 7),
        Prompt("mine:2", "default", "Count to ten.", None),
    ]


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"text": "hi"}', "expected a prompt line ('prompt'), a chat request"),
        ('{"question_id": 1, "category": "x", "turns": []}', "'turns' must be a non-empty list"),
        ('{"question_id": 1, "turns": [3]}', "first turn must be a non-empty string"),
        ('{"question_id": [1], "category": "x", "turns": ["a"]}', "'question_id' must be"),
        ('{"prompt": ""}', "'prompt' must be a non-empty string"),
        ('{"prompt": "hi", "max_tokens": 0}', "'max_tokens' must be an integer >= 1"),
        ('{"prompt": "hi", "max_tokens": true}', "'max_tokens' must be an integer >= 1"),
        ('{"prompt": "hi", "max_token": 5}', "unknown key(s) 'max_token'"),
        ('{"prompt": "hi", "category": 5}', "'category' must be a non-empty string"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path: Path, bad_line: str, problem: str) -> None:
    # a file holds one format: a good line of the bad line's format first
    fine = '{"question_id": 0, "category": "x", "turns": ["fine"]}'
    if '"turns"' not in bad_line:
        fine = '{"prompt": "fine"}'
    path = _write_lines(tmp_path / "w.jsonl", [fine, "", bad_line])
    with pytest.raises(BadInputError) as info:
        load_workload_file(path)
    assert info.value.where == str(path)
    assert info.value.problem.startswith("line 3: ")
    assert problem in info.value.problem


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="not found"):
        load_workload_file(tmp_path / "absent.jsonl")
    empty = _write_lines(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(BadInputError, match="no prompts"):
        load_workload_file(empty)


def test_workload_id_follows_content_and_order() -> None:
    a, b = Prompt("1", "x", "one"), Prompt("2", "x", "two")
    assert workload_id([a, b]) == workload_id([Prompt("1", "x", "one"), b])
    assert workload_id([a, b]) != workload_id([b, a])
    assert workload_id([a, b]) != workload_id([a, Prompt("2", "x", "two", 5)])


def test_openai_completions_log_keeps_per_request_sampling(tmp_path: Path) -> None:
    body = {"model": "m", "prompt": "Hi.", "max_completion_tokens": 9, "temperature": 0.8}
    path = _write_lines(
        tmp_path / "log.jsonl",
        [
            json.dumps({**body, "top_p": 0.9, "stop": "\n", "stream": True, "n": 1}),
            json.dumps({"prompt": "Plain.", "max_tokens": 4}),
        ],
    )
    first, second = load_workload_file(path)
    assert first == Prompt("log:1", "default", "Hi.", 9, 0.8, 0.9, ("\n",))
    assert second.sampling() == {}
    assert workload_id([second]) == workload_id([Prompt("log:2", "default", "Plain.", 4)])
    assert workload_id([first]) != workload_id([Prompt("log:1", "default", "Hi.", 9)])
    bad = _write_lines(tmp_path / "bad.jsonl", [json.dumps({**body, "n": 2})])
    with pytest.raises(BadInputError, match="line 1: 'n' must be 1"):
        load_workload_file(bad)
