"""Workload files of every format (tests/data/workloads/): detection, parsing, the bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectool.engine.tokenizer import plain_chat_text
from spectool.errors import BadInputError
from spectool.measure.client import tokenizer_counter
from spectool.measure.workload_datasets import Trace
from spectool.measure.workload_files import detect_format, read_workload
from spectool.measure.workloads import ChatMessage, Prompt, workload_id

DATA = Path(__file__).resolve().parents[1] / "data" / "workloads"
DEMO_TARGET = Path(__file__).resolve().parents[2] / "spectool" / "assets" / "models" / "demo-target"


def _words(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("completions.jsonl", "prompts"),
        ("chat.jsonl", "chat"),
        ("question.jsonl", "spec-bench"),
        ("sharegpt.json", "sharegpt"),
        ("sharegpt.jsonl", "sharegpt"),
        ("trace.jsonl", "trace"),
    ],
)
def test_the_format_is_told_by_the_content(name: str, fmt: str) -> None:
    assert detect_format(DATA / name) == fmt
    assert read_workload(DATA / name).format == fmt


def test_chat_requests_keep_messages_and_their_own_sampling() -> None:
    first, second, third = read_workload(DATA / "chat.jsonl").prompts
    system = ChatMessage("system", "You are terse.")
    user = ChatMessage("user", "Name a prime.")
    assert first.messages == (system, user)
    assert first.text == plain_chat_text([system.to_json(), user.to_json()])
    assert (first.max_tokens, first.temperature, first.top_p, first.stop) == (
        9,
        0.7,
        0.9,
        ("\n\n",),
    )
    assert second.messages == (ChatMessage("user", "Count to three."),)  # text parts joined
    assert (second.category, second.max_tokens, second.sampling()) == ("count", 6, {})
    assert third.prompt_id == "chat:4" and third.max_tokens is None
    # The target's chat template renders the text the prompt is counted on.
    rendered = read_workload(
        DATA / "chat.jsonl", render_chat=lambda ms: "|".join(m["content"] for m in ms)
    ).prompts
    assert rendered[0].text == "You are terse.|Name a prime."
    assert rendered[0].messages == first.messages
    # The messages are part of the workload's identity.
    assert workload_id([first]) != workload_id([Prompt(first.prompt_id, "default", first.text)])


def test_sharegpt_asks_the_first_question_and_sizes_the_output_by_the_answer() -> None:
    read = read_workload(DATA / "sharegpt.json")
    assert [p.prompt_id for p in read.prompts] == ["conv-a", "conv-c", "sharegpt:5"]
    a, c, last = read.prompts
    assert a.text == "What is speculative decoding?"
    assert a.max_tokens == _words(
        "A draft model proposes tokens and the target verifies them at once."
    )
    assert (c.text, c.max_tokens) == ("List three colours.", 3)  # the gpt turn after the question
    assert last.max_tokens == 1
    assert read.skipped == 2  # conv-b has no answer, conv-d an empty one
    # With the target's tokenizer the answer is counted in its tokens.
    count = tokenizer_counter(DEMO_TARGET)
    counted = read_workload(DATA / "sharegpt.json", count_tokens=count).prompts
    assert counted[0].max_tokens == count(
        "A draft model proposes tokens and the target verifies them at once."
    )
    lines = read_workload(DATA / "sharegpt.jsonl")
    assert [(p.prompt_id, p.max_tokens) for p in lines.prompts] == [("7", 3)]
    assert lines.skipped == 1


def test_spec_bench_asks_the_first_turn_and_keeps_the_category() -> None:
    first, second = read_workload(DATA / "question.jsonl").prompts
    assert first == Prompt("81", "writing", "Write a travel blog post about Hawaii.")
    assert (second.category, second.max_tokens) == ("math_reasoning", None)  # --max-tokens


def test_trace_prompts_have_the_lengths_arrivals_and_shared_prefixes_of_the_trace() -> None:
    read = read_workload(DATA / "trace.jsonl")
    a, b, c, d = read.prompts
    assert [_words(p.text) for p in read.prompts] == [600, 530, 40, 300]
    assert [p.max_tokens for p in read.prompts] == [12, 5, 3, 7]
    assert [p.arrival_s for p in read.prompts] == [0.0, 0.25, 0.25, 1.5005]
    # hash id 1 is the same 512-token block in rows 1 and 2; blocks 2 and 3 differ
    assert a.text.split()[:512] == b.text.split()[:512]
    assert a.text.split()[512:530] != b.text.split()[512:]
    assert c.text.split() != a.text.split()[:40]
    assert read_workload(DATA / "trace.jsonl").prompts == read.prompts  # deterministic
    slow = read_workload(DATA / "trace.jsonl", time_scale=2.0)
    assert [p.arrival_s for p in slow.prompts] == [0.0, 0.5, 0.5, 3.001]
    assert workload_id(slow.prompts) != workload_id(read.prompts)
    assert d.prompt_id == "trace:4"


def test_a_trace_row_may_carry_its_exact_text_as_aiperf_reads_it(tmp_path: Path) -> None:
    """AIPerf's mooncake_trace rows may give ``text_input`` instead of ``input_length``
    (aiperf 0.13 ``aiperf/dataset/loader/models.py`` ``MooncakeTrace``): the same file then
    replays the same texts at the same times in both tools."""
    path = tmp_path / "trace.jsonl"
    rows = [
        {"timestamp": 0, "text_input": "def add(a, b):", "output_length": 8},
        {"timestamp": 250.5, "text_input": "Once upon a time", "output_length": 3},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    read = read_workload(path)
    assert read.format == "trace"
    assert [(p.text, p.max_tokens, p.arrival_s) for p in read.prompts] == [
        ("def add(a, b):", 8, 0.0),
        ("Once upon a time", 3, 0.2505),
    ]


def test_trace_prompts_are_exact_in_the_target_tokenizer() -> None:
    count = tokenizer_counter(DEMO_TARGET)
    read = read_workload(DATA / "trace.jsonl", count_tokens=count)
    assert [count(p.text) for p in read.prompts] == [600, 530, 40, 300]


def test_a_shorter_last_block_is_a_prefix_of_the_full_block() -> None:
    trace = Trace(None, block_tokens=8)
    where = _place()
    full = trace.prompt(
        where, {"timestamp": 0, "input_length": 16, "output_length": 2, "hash_ids": [5, 6]}
    )
    part = trace.prompt(
        where, {"timestamp": 1, "input_length": 11, "output_length": 2, "hash_ids": [5, 6]}
    )
    assert full.text.split()[:11] == part.text.split()


def _place():
    from spectool.measure.workload_datasets import Where

    return Where(Path("t.jsonl"), "line 1", 1)


TRACE_ROW = {"timestamp": 0, "input_length": 4, "output_length": 2}


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        (["{not json"], "line 1: not valid JSON"),
        (["", "", "   "], "no prompts in the file"),
        (
            ['{"prompt": "a"}', '{"messages": [{"role": "user", "content": "b"}]}'],
            "line 2: a chat request in a file of prompt lines",
        ),
        (['{"prompt": "a", "messages": []}'], "line 1: has 'prompt' and 'messages'"),
        (['{"messages": []}'], "line 1: 'messages' must be a non-empty list"),
        (['{"messages": [{"content": "hi"}]}'], "line 1: message 1: 'role' must be one of"),
        (['{"messages": [{"role": "user"}]}'], "line 1: message 1: 'content' must be a string"),
        (
            ['{"messages": [{"role": "user", "content": "hi", "tool_calls": []}]}'],
            "unsupported key(s) 'tool_calls'",
        ),
        (
            ['{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}'],
            "'max_tokens' must be an integer >= 1",
        ),
        (
            ['{"messages": [{"role": "user", "content": "hi"}], "top_p": 0}'],
            "'top_p' must be a number in (0, 1]",
        ),
        (
            ['{"messages": [{"role": "user", "content": "hi"}], "tools": []}'],
            "unknown key(s) 'tools'",
        ),
        (['{"question_id": 1, "turns": ["q"]}'], "line 1: missing 'category'"),
        (['{"category": "x", "turns": ["q"]}'], "line 1: missing 'question_id'"),
        (['{"conversations": {"from": "human"}}'], "line 1: 'conversations' must be a list"),
        (
            ['{"conversations": [{"from": "human"}]}'],
            "line 1: turn 1 must be an object with string 'from' and 'value'",
        ),
        (['{"timestamp": 0, "input_length": 4}'], "line 1: a trace row needs 'output_length'"),
        (['{"input_length": 4, "output_length": 2}'], "line 1: a trace row needs 'timestamp'"),
        (
            [json.dumps({**TRACE_ROW, "input_length": -4})],
            "'input_length' must be an integer >= 1, got -4",
        ),
        (
            [json.dumps({**TRACE_ROW, "output_length": 0})],
            "'output_length' must be an integer >= 1",
        ),
        ([json.dumps({**TRACE_ROW, "timestamp": -1})], "'timestamp' must be a number of ms >= 0"),
        (
            [json.dumps({**TRACE_ROW, "timestamp": 5}), json.dumps(TRACE_ROW)],
            "line 2: timestamp 0 ms is before line 1's 5 ms",
        ),
        (
            [json.dumps({**TRACE_ROW, "hash_ids": [1, 2]})],
            "does not fit 2 hash_ids blocks of 512 tokens",
        ),
        ([json.dumps({**TRACE_ROW, "hash_ids": ["a"]})], "'hash_ids' must be a list of integers"),
        ([json.dumps({**TRACE_ROW, "input_text": "hi"})], "unsupported key(s) 'input_text'"),
        (
            [json.dumps({**TRACE_ROW, "text_input": "hi"})],
            "needs one of 'input_length' and 'text_input'",
        ),
        (['{"timestamp": 0, "output_length": 2}'], "needs one of 'input_length' and 'text_input'"),
        (['{"timestamp": 0, "output_length": 2, "text_input": ""}'], "non-empty string"),
    ],
)
def test_bad_records_name_the_file_and_line(tmp_path: Path, lines: list[str], problem: str) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(BadInputError) as info:
        read_workload(path)
    assert info.value.where == str(path)
    assert problem in info.value.problem


def test_bad_entries_of_a_json_list_name_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "sharegpt.json"
    good = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}
    path.write_text(json.dumps([good, {"conversations": [{"value": "x"}]}]), encoding="utf-8")
    with pytest.raises(BadInputError, match="entry 2: turn 1 must be"):
        read_workload(path)
    path.write_text('[{"conversations": [}', encoding="utf-8")
    with pytest.raises(BadInputError, match="line 1: not valid JSON"):
        read_workload(path)


def test_no_answer_anywhere_and_a_time_scale_without_a_trace_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"conversations": [{"from": "human", "value": "q"}]}) + "\n")
    with pytest.raises(BadInputError, match="none of its 1 conversations has an answer"):
        read_workload(path)
    with pytest.raises(BadInputError, match="--time-scale: scales a trace's timestamps"):
        read_workload(DATA / "question.jsonl", time_scale=2.0)
    with pytest.raises(BadInputError, match="--time-scale: must be > 0"):
        read_workload(DATA / "trace.jsonl", time_scale=0.0)
