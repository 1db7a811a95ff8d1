"""The OpenAI-compatible app end to end (FastAPI TestClient, real engine, tiny real models).

The served engine speculates (draft_model, k=3), so one engine event often carries several
tokens; the reference outputs come from a separate target-only engine's ``Engine.generate``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from server_helpers import sse_events, wait_healthy

import spectool
from spectool.engine.engine import Engine, EngineConfig, SamplingParams
from spectool.server.app import create_app
from spectool.trtllm.iter_stats import parse_iteration_stats

MODEL = "tiny-spec"
MAX_SEQ_LEN = 512
PROMPTS = (
    "The draft model proposes",
    "Serving engines measure acceptance",
    "large batches leave no spare compute and the drafter only adds latency",
    "hello",
)


@pytest.fixture(scope="module")
def spec_config() -> EngineConfig:
    return EngineConfig(
        method="draft_model", max_draft_len=3, max_batch_size=4, max_seq_len=MAX_SEQ_LEN
    )


@pytest.fixture(scope="module")
def client(target_dir: Path, drafter_dir: Path, spec_config: EngineConfig) -> Iterator[TestClient]:
    app = create_app(lambda: Engine(target_dir, drafter_dir, spec_config), model_name=MODEL)
    with TestClient(app) as test_client:
        wait_healthy(test_client.get)
        yield test_client


@pytest.fixture(scope="module")
def reference(target_dir: Path) -> Engine:
    """A target-only engine: the outputs greedy speculative serving must reproduce."""
    return Engine(target_dir, None, EngineConfig(max_seq_len=MAX_SEQ_LEN))


def _generate(engine: Engine, prompt_ids: list[int], **params: Any) -> list[int]:
    return engine.generate([prompt_ids], SamplingParams(**params))[0]


def _stream(client: TestClient, path: str, body: dict[str, Any]) -> list[Any]:
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return sse_events(response.iter_lines())


def _eventually(condition: Callable[[], bool], deadline_s: float = 10.0) -> bool:
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def _driver(client: TestClient) -> Any:
    return client.app.state.spectool.driver  # type: ignore[attr-defined]


# -- lifecycle ---------------------------------------------------------------------------------


def test_health_is_503_while_loading_then_200(target_dir: Path) -> None:
    release = threading.Event()

    def slow_factory() -> Engine:
        assert release.wait(30)
        return Engine(target_dir, None, EngineConfig(max_seq_len=64, max_batch_size=2))

    with TestClient(create_app(slow_factory, model_name="slow")) as c:
        loading = c.get("/health")
        assert loading.status_code == 503
        assert "is loading" in loading.json()["error"]["message"]
        refused = c.post("/v1/completions", json={"prompt": "hi"})
        assert refused.status_code == 503
        assert refused.json()["error"]["type"] == "service_unavailable"
        release.set()
        wait_healthy(c.get)
        assert c.get("/health").status_code == 200
        assert c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_failed_load_is_reported_not_hidden(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with TestClient(create_app(lambda: Engine(missing), model_name="broken")) as c:
        for _ in range(500):
            if c.app.state.spectool.load_error is not None:  # type: ignore[attr-defined]
                break
            threading.Event().wait(0.01)
        health = c.get("/health")
        assert health.status_code == 503
        assert "failed to load" in health.json()["error"]["message"]
        assert str(missing) in health.json()["error"]["message"]


def test_version_and_models(client: TestClient) -> None:
    assert client.get("/version").json() == {
        "version": spectool.__version__,
        "engine": "spectool-torch",
    }
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == MAX_SEQ_LEN


# -- completions -------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_completion_equals_engine_generate(
    client: TestClient, reference: Engine, prompt: str
) -> None:
    prompt_ids = reference.tokenizer.encode(prompt)
    expected = _generate(reference, prompt_ids, max_tokens=10)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 10, "temperature": 0}
    response = client.post("/v1/completions", json={**body, "return_token_ids": True})
    assert response.status_code == 200
    data = response.json()
    choice = data["choices"][0]
    assert data["object"] == "text_completion"
    assert data["prompt_token_ids"] == prompt_ids
    assert choice["token_ids"] == expected
    assert choice["text"] == reference.tokenizer.decode(expected)
    assert choice["finish_reason"] == ("stop" if len(expected) < 10 else "length")
    assert data["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(expected),
        "total_tokens": len(prompt_ids) + len(expected),
    }
    # The same request streamed: deltas concatenate to the same text, usage comes last.
    events = _stream(client, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == data["usage"]
    chunks = events[:-2]
    assert all(c["object"] == "text_completion" and "usage" not in c for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == choice["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert len({c["id"] for c in chunks}) == 1


def test_token_id_prompt_and_ignore_eos(client: TestClient, reference: Engine) -> None:
    prompt_ids = reference.tokenizer.encode("The draft model proposes")
    expected = _generate(reference, prompt_ids, max_tokens=20, ignore_eos=True)
    for prompt in (prompt_ids, [prompt_ids]):
        response = client.post(
            "/v1/completions",
            json={
                "prompt": prompt,
                "max_tokens": 20,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            },
        )
        assert response.status_code == 200
        assert response.json()["choices"][0]["token_ids"] == expected
        assert response.json()["usage"]["completion_tokens"] == 20


def test_continuous_usage_counts_tokens_per_chunk(client: TestClient) -> None:
    """vLLM's continuous_usage_stats: every chunk carries the running usage, so a client can
    count the several tokens one speculative step delivers in one chunk."""
    body = {
        "prompt": "The draft model proposes",
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    events = _stream(client, "/v1/completions", body)
    chunks = events[:-2]
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts)
    assert counts[-1] == events[-2]["usage"]["completion_tokens"] == 24
    assert all(c["usage"]["prompt_tokens"] == events[-2]["usage"]["prompt_tokens"] for c in chunks)
    assert len(chunks) < 24  # speculation delivered several tokens in some chunk


def test_stream_without_include_usage_has_no_usage_chunk(client: TestClient) -> None:
    events = _stream(client, "/v1/completions", {"prompt": "hello", "max_tokens": 4})
    assert events[-1] == "[DONE]"
    assert all(e["choices"] and "usage" not in e for e in events[:-1])


# -- chat --------------------------------------------------------------------------------------


def test_chat_greedy_equals_engine_generate_on_the_template(
    client: TestClient, reference: Engine
) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is "},
                {"type": "text", "text": "speculation"},
            ],
        },
    ]
    prompt_ids = reference.tokenizer.encode_chat(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "what is speculation"},
        ]
    )
    expected = _generate(reference, prompt_ids, max_tokens=8, ignore_eos=True)
    body = {"messages": messages, "max_completion_tokens": 8, "temperature": 0, "ignore_eos": True}
    data = client.post("/v1/chat/completions", json={**body, "return_token_ids": True}).json()
    assert data["object"] == "chat.completion"
    assert data["prompt_token_ids"] == prompt_ids
    choice = data["choices"][0]
    assert choice["token_ids"] == expected
    assert choice["message"] == {
        "role": "assistant",
        "content": reference.tokenizer.decode(expected),
    }
    assert choice["finish_reason"] == "length"
    assert data["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": 8,
        "total_tokens": len(prompt_ids) + 8,
    }

    events = _stream(
        client, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}}
    )
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"] == [] and events[-2]["usage"] == data["usage"]
    chunks = events[:-2]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == choice["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_without_max_tokens_runs_to_the_context_limit_or_eos(
    client: TestClient, reference: Engine
) -> None:
    messages = [{"role": "user", "content": "hi"}]
    prompt_ids = reference.tokenizer.encode_chat(messages)
    data = client.post("/v1/chat/completions", json={"messages": messages, "temperature": 0}).json()
    expected = _generate(reference, prompt_ids, max_tokens=MAX_SEQ_LEN - len(prompt_ids))
    assert data["usage"]["completion_tokens"] == len(expected)


# -- stop strings ------------------------------------------------------------------------------


def _tokens_until(reference: Engine, ids: list[int], stop: str) -> int:
    """How many output tokens it takes for the decoded text to contain ``stop``."""
    for n in range(1, len(ids) + 1):
        if stop in reference.tokenizer.decode(ids[:n]):
            return n
    raise AssertionError(f"{stop!r} never appears")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_the_text_and_aborts_the_request(
    client: TestClient, reference: Engine, stream: bool
) -> None:
    prompt = "Serving engines measure acceptance"
    full_ids = _generate(
        reference, reference.tokenizer.encode(prompt), max_tokens=40, ignore_eos=True
    )
    full_text = reference.tokenizer.decode(full_ids)
    stop = full_text[len(full_text) // 2 : len(full_text) // 2 + 3]
    expected_text = full_text[: full_text.find(stop)]
    expected_tokens = _tokens_until(reference, full_ids, stop)
    assert expected_tokens < 40
    body = {
        "prompt": prompt,
        "max_tokens": 40,
        "temperature": 0,
        "ignore_eos": True,
        "stop": ["never-there", stop],
    }
    aborts_before = _driver(client).finish_counts["abort"]
    if stream:
        events = _stream(
            client, "/v1/completions", {**body, "stream_options": {"include_usage": True}}
        )
        chunks = events[:-2]
        text = "".join(c["choices"][0]["text"] for c in chunks)
        finish = chunks[-1]["choices"][0]["finish_reason"]
        usage = events[-2]["usage"]
        # Held back while it could start a stop string: no delta ever shows part of `stop`.
        assert all(stop not in c["choices"][0]["text"] for c in chunks)
    else:
        data = client.post("/v1/completions", json=body).json()
        text = data["choices"][0]["text"]
        finish = data["choices"][0]["finish_reason"]
        usage = data["usage"]
    assert text == expected_text
    assert finish == "stop"
    assert usage["completion_tokens"] == expected_tokens
    # The engine request was aborted at the stop string, not run to max_tokens.
    driver = _driver(client)
    assert _eventually(lambda: driver.finish_counts["abort"] == aborts_before + 1)
    assert driver.num_unfinished == 0
    assert not driver.engine.has_work()


def test_include_stop_str_in_output(client: TestClient, reference: Engine) -> None:
    prompt = "The draft model proposes"
    full_ids = _generate(
        reference, reference.tokenizer.encode(prompt), max_tokens=30, ignore_eos=True
    )
    full_text = reference.tokenizer.decode(full_ids)
    stop = full_text[10:13]
    data = client.post(
        "/v1/completions",
        json={
            "prompt": prompt,
            "max_tokens": 30,
            "temperature": 0,
            "ignore_eos": True,
            "stop": stop,
            "include_stop_str_in_output": True,
        },
    ).json()
    assert data["choices"][0]["text"] == full_text[: full_text.find(stop) + len(stop)]


def test_stop_token_ids_end_the_request(client: TestClient, reference: Engine) -> None:
    prompt_ids = reference.tokenizer.encode("The draft model proposes")
    full_ids = _generate(reference, prompt_ids, max_tokens=20, ignore_eos=True)
    stop_id = full_ids[5]
    data = client.post(
        "/v1/completions",
        json={
            "prompt": prompt_ids,
            "max_tokens": 20,
            "temperature": 0,
            "ignore_eos": True,
            "stop_token_ids": [stop_id],
            "return_token_ids": True,
        },
    ).json()
    assert data["choices"][0]["token_ids"] == full_ids[: full_ids.index(stop_id) + 1]
    assert data["choices"][0]["finish_reason"] == "stop"


def test_seeded_sampling_is_reproducible(client: TestClient) -> None:
    body = {"prompt": "hello", "max_tokens": 12, "temperature": 1.0, "seed": 7, "top_k": 50}
    first = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    second = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert first == second


# -- malformed requests ------------------------------------------------------------------------

BAD_COMPLETIONS: list[tuple[str, Any, int, str | None]] = [
    ("bad json", b'{"prompt": "x",', 400, None),
    ("not an object", [1, 2], 400, None),
    ("missing prompt", {"max_tokens": 3}, 400, "prompt"),
    ("max_tokens as string", {"prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
    ("max_tokens zero", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("temperature as string", {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ("negative temperature", {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("top_p above 1", {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("stream as string", {"prompt": "x", "stream": "yes"}, 400, "stream"),
    ("prompt as number", {"prompt": 5}, 400, "prompt"),
    ("two prompts", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("empty prompt list", {"prompt": []}, 400, "prompt"),
    ("n=2", {"prompt": "x", "n": 2}, 400, "n"),
    ("logprobs", {"prompt": "x", "logprobs": 1}, 400, "logprobs"),
    ("unknown field", {"prompt": "x", "max_token": 3}, 400, "max_token"),
    (
        "stream_options without stream",
        {"prompt": "x", "stream_options": {"include_usage": True}},
        400,
        None,
    ),
    ("empty stop string", {"prompt": "x", "stop": [""]}, 400, "stop"),
    ("penalty", {"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ("echo", {"prompt": "x", "echo": True}, 400, "echo"),
    ("token id out of range", {"prompt": [1, 10**6]}, 400, "prompt"),
    ("too long prompt", {"prompt": "hello " * 600}, 400, "prompt"),
    ("min_tokens above max_tokens", {"prompt": "x", "min_tokens": 9, "max_tokens": 3}, 400, None),
    ("unknown model", {"prompt": "x", "model": "gpt-4"}, 404, "model"),
]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [case[1:] for case in BAD_COMPLETIONS],
    ids=[case[0] for case in BAD_COMPLETIONS],
)
def test_malformed_completion_requests_get_openai_errors(
    client: TestClient, body: Any, status: int, param: str | None
) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = client.post(
        "/v1/completions", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param


BAD_CHATS: list[tuple[str, Any, str | None]] = [
    ("messages as string", {"messages": "hi"}, "messages"),
    ("no messages", {"messages": []}, "messages"),
    ("unknown role", {"messages": [{"role": "robot", "content": "hi"}]}, "messages"),
    (
        "image content",
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        },
        "messages",
    ),
    ("logprobs", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}, "logprobs"),
    (
        "top_logprobs",
        {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2},
        "top_logprobs",
    ),
    ("n=3", {"messages": [{"role": "user", "content": "hi"}], "n": 3}, "n"),
    (
        "tools",
        {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
        "tools",
    ),
    ("too long", {"messages": [{"role": "user", "content": "hello " * 600}]}, "prompt"),
]


@pytest.mark.parametrize(
    ("body", "param"), [case[1:] for case in BAD_CHATS], ids=[case[0] for case in BAD_CHATS]
)
def test_malformed_chat_requests_get_openai_errors(
    client: TestClient, body: Any, param: str | None
) -> None:
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_harmless_openai_fields_are_accepted(client: TestClient) -> None:
    response = client.post(
        "/v1/completions",
        json={
            "prompt": "x",
            "max_tokens": 2,
            "user": "someone",
            "n": 1,
            "logprobs": None,
            "frequency_penalty": 0,
            "presence_penalty": 0.0,
            "repetition_penalty": 1.0,
            "best_of": 1,
            "stop": None,
        },
    )
    assert response.status_code == 200


@pytest.mark.parametrize(
    "extreme",
    [
        {"temperature": 1e-300},  # logits / 1e-300 overflow: raised to 1e-2
        {"temperature": 50.0, "top_p": 1e-300},
        {"top_k": 10**12},
        {"seed": 2**63 - 1},
        {"seed": -(2**63)},
        {"stop_token_ids": [-5, 10**12]},
    ],
)
def test_extreme_but_valid_values_do_not_break_the_engine(
    client: TestClient, extreme: dict[str, Any]
) -> None:
    body = {"prompt": "hello", "max_tokens": 4, **extreme}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1
    assert client.get("/health").status_code == 200  # the engine thread survived


def test_max_tokens_beyond_the_context_is_refused_with_the_numbers(client: TestClient) -> None:
    """As vLLM does: 400 naming the context, the prompt and the completion, not a silent cut."""
    prompt = [5] * (MAX_SEQ_LEN - 8)
    for max_tokens in (9, 10**12):
        response = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "max_tokens" and error["type"] == "invalid_request_error"
        assert f"maximum context length is {MAX_SEQ_LEN} tokens" in error["message"]
        assert (
            f"({MAX_SEQ_LEN - 8} in the prompt, {max_tokens} in the completion)"
            in (error["message"])
        )
    fits = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8})
    assert fits.status_code == 200 and fits.json()["usage"]["completion_tokens"] >= 1
    assert client.get("/health").status_code == 200


def test_out_of_range_seed_is_refused(client: TestClient) -> None:
    response = client.post("/v1/completions", json={"prompt": "x", "seed": 2**64})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "seed"


def test_unknown_route_is_a_json_404(client: TestClient) -> None:
    response = client.get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["message"]


# -- /metrics ----------------------------------------------------------------------------------


def test_metrics_drain_on_read_and_parse_as_trtllm_iteration_stats(client: TestClient) -> None:
    client.get("/metrics")  # start from an empty buffer
    response = client.post(
        "/v1/completions",
        json={"prompt": "The draft model", "max_tokens": 12, "temperature": 0, "ignore_eos": True},
    )
    assert response.status_code == 200
    raw = client.get("/metrics").json()
    assert raw, "an iteration ran, so /metrics must report it"
    records = parse_iteration_stats(raw)
    assert client.get("/metrics").json() == []  # drained on read
    assert [r.iter for r in records] == sorted(r.iter for r in records)
    assert sum(r.num_new_active_requests or 0 for r in records) == 1
    assert sum(r.num_completed_requests or 0 for r in records) == 1
    spec = [r.spec_decoding for r in records]
    assert all(s is not None for s in spec)
    drafted = sum(s.num_draft_tokens for s in spec if s)
    accepted = sum(s.num_accepted_tokens for s in spec if s)
    assert drafted > 0
    # Output = the token sampled at prefill + per decode step (accepted drafts + 1 target token).
    decode_steps = sum(
        max(s.num_requests_with_draft_tokens, 1)
        for r, s in zip(records, spec, strict=True)
        if s and r.inflight_batching and r.inflight_batching.num_gen_requests
    )
    assert 1 + accepted + decode_steps == 12
    for r, entry in zip(records, raw, strict=True):
        s = r.spec_decoding
        assert s is not None and r.spectool is not None
        if s.num_requests_with_draft_tokens:
            assert s.acceptance_length == pytest.approx(
                (s.num_accepted_tokens + s.num_requests_with_draft_tokens)
                / s.num_requests_with_draft_tokens
            )
        assert s.draft_latency_ms == pytest.approx(r.spectool.draft_ms)
        assert s.draft_overhead == pytest.approx(r.spectool.draft_ms / r.iter_latency_ms)
        assert sum(r.spectool.accepted_per_pos) == s.num_accepted_tokens
        assert sum(r.spectool.drafted_per_pos) == s.num_draft_tokens
        assert r.kv_cache is not None and r.kv_cache.max_num_blocks == 4 * MAX_SEQ_LEN
        assert entry["maxNumActiveRequests"] == 4
    assert records[-1].num_active_requests <= 1


def test_metrics_without_speculation_have_no_spec_decoding_stats(target_dir: Path) -> None:
    config = EngineConfig(max_seq_len=64, max_batch_size=2)
    with TestClient(create_app(lambda: Engine(target_dir, None, config), model_name="p")) as c:
        wait_healthy(c.get)
        assert c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3}).status_code == 200
        raw = c.get("/metrics").json()
    assert raw
    assert all("specDecodingStats" not in entry for entry in raw)
    records = parse_iteration_stats(raw)
    assert all(r.spec_decoding is None for r in records)
    assert all(r.spectool is not None and r.spectool.drafted_per_pos == () for r in records)
