"""A real uvicorn server on 127.0.0.1 (in a thread): concurrency, disconnects, clean shutdown.

The engine speculates (draft_model, k=3) with ``max_batch_size`` 16, so 128 concurrent clients
make the engine batch 16 and queue the rest.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import LiveServer, sse_events, start_live_server

from spectool.engine.engine import Engine, EngineConfig, SamplingParams
from spectool.server.app import create_app
from spectool.server.driver import AsyncEngine, EngineDeadError, GenerationRequest
from spectool.trtllm.iter_stats import parse_iteration_stats

MAX_BATCH_SIZE = 16
NUM_CLIENTS = 128
MAX_TOKENS = 8
LOAD_DEADLINE_S = 120.0
LONG_MAX_TOKENS = 2000  # far more than a test waits for: only an abort ends it early
WORDS = "the draft model proposes tokens and the target verifies them in one pass".split()


@pytest.fixture(scope="module")
def live(target_dir: Path, drafter_dir: Path) -> Iterator[LiveServer]:
    config = EngineConfig(
        method="draft_model", max_draft_len=3, max_batch_size=MAX_BATCH_SIZE, max_seq_len=2048
    )
    app = create_app(lambda: Engine(target_dir, drafter_dir, config), model_name="tiny-spec")
    server = start_live_server(app)
    yield server
    server.stop()


def _prompts(n: int) -> list[str]:
    rng = random.Random(1234)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 24))) for _ in range(n)]


async def _stream_completion(client: httpx.AsyncClient, prompt: str) -> dict[str, Any]:
    body = {
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    async with client.stream("POST", "/v1/completions", json=body) as response:
        lines = [line async for line in response.aiter_lines()]
    assert response.status_code == 200, lines
    events = sse_events(lines)
    assert events[-1] == "[DONE]"
    chunks = events[:-2]
    return {
        "text": "".join(c["choices"][0]["text"] for c in chunks),
        "token_ids": [t for c in chunks for t in c["choices"][0]["token_ids"]],
        "finish_reason": chunks[-1]["choices"][0]["finish_reason"],
        "usage": events[-2]["usage"],
    }


def test_128_concurrent_streaming_clients_match_one_at_a_time(
    live: LiveServer, target_dir: Path
) -> None:
    prompts = _prompts(NUM_CLIENTS)
    httpx.get(f"{live.url}/metrics")  # start from an empty stats buffer

    async def run_all() -> tuple[list[Any], float]:
        limits = httpx.Limits(max_connections=NUM_CLIENTS * 2, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=live.url, limits=limits, timeout=60.0) as client:
            t0 = time.perf_counter()
            results = await asyncio.wait_for(
                asyncio.gather(
                    *(_stream_completion(client, p) for p in prompts), return_exceptions=True
                ),
                LOAD_DEADLINE_S,
            )
            return list(results), time.perf_counter() - t0

    concurrent, wall_s = asyncio.run(run_all())
    errors = [r for r in concurrent if isinstance(r, BaseException)]
    assert errors == []
    print(f"\n{NUM_CLIENTS} concurrent streaming clients: {wall_s:.2f} s wall, 0 errors")
    stats = parse_iteration_stats(httpx.get(f"{live.url}/metrics").json())
    assert max(s.num_active_requests for s in stats) == MAX_BATCH_SIZE  # batching happened
    assert max(s.num_queued_requests or 0 for s in stats) > 0  # the rest queued in the engine
    assert sum(s.num_new_active_requests or 0 for s in stats) == NUM_CLIENTS
    assert sum(s.num_completed_requests or 0 for s in stats) == NUM_CLIENTS
    assert stats[-1].num_active_requests <= MAX_BATCH_SIZE
    assert live.driver.num_unfinished == 0

    async def run_one_at_a_time() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=live.url, timeout=60.0) as client:
            return [await _stream_completion(client, p) for p in prompts]

    sequential = asyncio.run(run_one_at_a_time())
    assert concurrent == sequential
    # And both equal plain (non-speculative) greedy decoding of the target.
    reference = Engine(target_dir, None, EngineConfig(max_batch_size=32, max_seq_len=2048))
    prompt_ids = [reference.tokenizer.encode(p) for p in prompts]
    expected = reference.generate(prompt_ids, SamplingParams(max_tokens=MAX_TOKENS))
    assert [r["token_ids"] for r in sequential] == expected
    for result, ids, ref_ids in zip(sequential, prompt_ids, expected, strict=True):
        assert result["text"] == reference.tokenizer.decode(ref_ids)
        assert result["usage"]["prompt_tokens"] == len(ids)
        assert result["usage"]["completion_tokens"] == len(ref_ids)


def _wait_idle(live: LiveServer, aborts_before: int, deadline_s: float = 20.0) -> None:
    driver = live.driver
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if (
            driver.finish_counts["abort"] > aborts_before
            and driver.num_unfinished == 0
            and not driver.engine.has_work()
        ):
            return
        time.sleep(0.01)
    raise AssertionError(
        f"request not aborted: aborts {driver.finish_counts}, unfinished {driver.num_unfinished}"
    )


def _last_stats(live: LiveServer) -> Any:
    records = parse_iteration_stats(httpx.get(f"{live.url}/metrics").json())
    assert records
    return records[-1]


def test_streaming_client_disconnect_frees_its_slot(live: LiveServer) -> None:
    httpx.get(f"{live.url}/metrics")
    aborts_before = live.driver.finish_counts["abort"]
    body = {
        "prompt": "the draft",
        "max_tokens": LONG_MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(base_url=live.url, timeout=30.0) as client,
        client.stream("POST", "/v1/completions", json=body) as response,
    ):
        assert response.status_code == 200
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
        assert '"text"' in first
    # Leaving the block closed the connection mid-stream.
    _wait_idle(live, aborts_before)
    last = _last_stats(live)
    assert last.num_active_requests == 0
    assert last.kv_cache is not None and last.kv_cache.used_num_blocks == 0


def test_non_streaming_client_disconnect_frees_its_slot(live: LiveServer) -> None:
    httpx.get(f"{live.url}/metrics")
    aborts_before = live.driver.finish_counts["abort"]
    body = {"prompt": "the draft", "max_tokens": LONG_MAX_TOKENS, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{live.url}/v1/completions", json=body, timeout=httpx.Timeout(5.0, read=0.3))
    _wait_idle(live, aborts_before)
    assert _last_stats(live).num_active_requests == 0


def test_driver_shutdown_ends_streams_and_the_thread(target_dir: Path) -> None:
    engine = Engine(target_dir, None, EngineConfig(max_batch_size=2, max_seq_len=2048))
    prompt = tuple(engine.tokenizer.encode("the draft model"))

    async def scenario() -> None:
        driver = AsyncEngine(engine)
        driver.start()
        stream = driver.submit(
            GenerationRequest(prompt, SamplingParams(max_tokens=LONG_MAX_TOKENS, ignore_eos=True))
        )
        first = await stream.__anext__()
        assert first.token_ids and not first.finished
        t0 = time.perf_counter()
        driver.shutdown(timeout_s=10.0)
        assert time.perf_counter() - t0 < 5.0
        assert not driver.alive
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            driver.submit(GenerationRequest(prompt, SamplingParams(max_tokens=2)))

    asyncio.run(scenario())


def test_an_engine_failure_ends_every_stream_instead_of_hanging(target_dir: Path) -> None:
    engine = Engine(target_dir, None, EngineConfig(max_batch_size=2, max_seq_len=256))
    prompt = tuple(engine.tokenizer.encode("the draft model"))
    # A temperature this small makes the engine's softmax NaN: a real failure inside step()
    # (the HTTP layer raises such temperatures to 1e-2, so only the driver can be fed one).
    poison = SamplingParams(temperature=1e-300, max_tokens=4)

    async def scenario() -> None:
        driver = AsyncEngine(engine)
        driver.start()
        healthy = driver.submit(
            GenerationRequest(prompt, SamplingParams(max_tokens=200, ignore_eos=True))
        )
        failing = driver.submit(GenerationRequest(prompt, poison))
        for stream in (healthy, failing):
            with pytest.raises(EngineDeadError):
                async for _ in stream:
                    pass
        assert driver.error is not None and not driver.alive
        with pytest.raises(EngineDeadError):
            driver.submit(GenerationRequest(prompt, SamplingParams(max_tokens=2)))
        driver.shutdown(timeout_s=5.0)

    asyncio.run(asyncio.wait_for(scenario(), 30.0))


def test_draft_length_switch_endpoint_and_paged_iterations(live: LiveServer) -> None:
    """tune's two private endpoints: the draft length switched in place (0: the drafter idle),
    and iteration stats paged by number, which a /metrics reader cannot drain away."""
    url = live.url
    state = httpx.get(f"{url}/spectool/draft_len").json()
    assert state["draft_len"] is None and state["max_draft_len"] == 3
    assert httpx.post(f"{url}/spectool/draft_len", json={"k": 4}).status_code == 400
    assert httpx.post(f"{url}/spectool/draft_len", json={"k": -1}).status_code == 400
    assert httpx.post(f"{url}/spectool/draft_len", json={"k": 1, "x": 0}).status_code == 400
    body = {"prompt": "the draft model", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    outputs = {}
    for k in (0, 2):
        answer = httpx.post(f"{url}/spectool/draft_len", json={"k": k})
        assert answer.status_code == 200 and answer.json()["draft_len"] == k
        last = answer.json()["last_iteration"]
        outputs[k] = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
        httpx.get(f"{url}/metrics")  # another reader drains /metrics ...
        pages = httpx.get(f"{url}/spectool/iterations", params={"after": last}).json()
        assert pages and all(p["iter"] > last for p in pages)  # ... and takes nothing from us
        decoded = [p for p in pages if p["inflightBatchingStats"]["numGenRequests"]]
        assert {p["spectoolStats"]["draftLen"] for p in decoded} == {k}
        assert all(("specDecodingStats" in p) == (k > 0) for p in decoded)
        again = httpx.get(f"{url}/spectool/iterations", params={"after": last}).json()
        assert [p["iter"] for p in again] == [p["iter"] for p in pages]
    assert outputs[0]["choices"][0]["text"] == outputs[2]["choices"][0]["text"]
    httpx.post(f"{url}/spectool/draft_len", json={"k": None})


def test_draft_length_switch_waits_for_requests_in_flight(live: LiveServer) -> None:
    """Refused (409) while a request is open, even one the engine has finished but whose
    stream is still being read; accepted once it is closed."""
    driver = live.driver
    prompt = tuple(driver.tokenizer.encode("the target"))
    loop = driver._loop
    assert loop is not None
    submitted = asyncio.run_coroutine_threadsafe(
        _submit(driver, GenerationRequest(prompt, SamplingParams(max_tokens=4, ignore_eos=True))),
        loop,
    )
    stream = submitted.result(timeout=30)
    busy = httpx.post(f"{live.url}/spectool/draft_len", json={"k": 0})
    assert busy.status_code == 409
    assert "requests run" in busy.json()["error"]["message"]
    loop.call_soon_threadsafe(stream.close)
    deadline = time.monotonic() + 30
    while httpx.post(f"{live.url}/spectool/draft_len", json={"k": None}).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)


async def _submit(driver: AsyncEngine, request: GenerationRequest) -> Any:
    return driver.submit(request)


def test_first_streamed_chunk_carries_the_prefill_token_alone(live: LiveServer) -> None:
    """TTFT is prefill: the first content chunk holds one token, not one plus a decode step."""
    body = {
        "prompt": "the draft model proposes",
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    with httpx.stream("POST", f"{live.url}/v1/completions", json=body, timeout=60) as response:
        events = sse_events(list(response.iter_lines()))
    counts = [e["usage"]["completion_tokens"] for e in events[:-1] if e.get("usage")]
    assert counts[0] == 1 and counts[-1] == 12


def _prometheus(url: str) -> dict[str, float]:
    response = httpx.get(f"{url}/prometheus/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    values = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            assert name.endswith('{model_name="tiny-spec",engine_type="spectool"}')
            values[name.split("{")[0]] = float(value)
    return values


def test_prometheus_totals_at_trtllm_serves_path_are_never_drained(live: LiveServer) -> None:
    before = _prometheus(live.url)
    body = {"prompt": "the draft model", "max_tokens": 7, "temperature": 0, "ignore_eos": True}
    usage = httpx.post(f"{live.url}/v1/completions", json=body, timeout=60).json()["usage"]
    httpx.get(f"{live.url}/metrics")  # draining the JSON stats takes nothing from the totals
    after = _prometheus(live.url)
    assert _prometheus(live.url) == after  # reading twice changes nothing
    delta = {name: after[name] - before[name] for name in after}
    assert delta["trtllm_num_requests_completed_total"] == 1
    assert delta["trtllm_generation_tokens_total"] == usage["completion_tokens"] == 7
    assert delta["trtllm_prompt_tokens_total"] == usage["prompt_tokens"]
    assert delta["trtllm_spec_decode_num_draft_tokens_total"] > 0
    drafted = delta["trtllm_spec_decode_num_draft_tokens_total"]
    assert 0 <= delta["trtllm_spec_decode_num_accepted_tokens_total"] <= drafted
    assert delta["trtllm_iterations_total"] >= 2  # a prefill, then decode steps


def _check_spec_payload(spec: dict[str, Any], completion_tokens: int, max_draft_len: int) -> None:
    """vLLM's per-request shape (what AIPerf 0.13 validates): the histogram has k + 1 buckets,
    its counts are the steps and its j-weighted sum the accepted drafts."""
    histogram = spec["acceptance_histogram"]
    assert spec["num_spec_tokens"] == max_draft_len and len(histogram) == max_draft_len + 1
    assert sum(histogram) == spec["num_spec_steps"] >= 1
    assert sum(j * n for j, n in enumerate(histogram)) == spec["num_accepted_draft_tokens"]
    assert spec["num_accepted_draft_tokens"] <= spec["num_draft_tokens"]
    assert spec["mean_acceptance_length"] == pytest.approx(
        1 + spec["num_accepted_draft_tokens"] / spec["num_spec_steps"]
    )
    # each drafting step confirms its accepted drafts plus one, the prefill gave the first
    # token, and steps with no room left to draft (the last token) confirm one each
    assert 1 + spec["num_spec_steps"] + spec["num_accepted_draft_tokens"] <= completion_tokens


def test_per_request_speculative_metrics_in_vllms_shape(live: LiveServer) -> None:
    body = {"prompt": "the draft model proposes", "max_tokens": 10, "temperature": 0}
    body["ignore_eos"] = True
    plain = httpx.post(f"{live.url}/v1/completions", json=body, timeout=60).json()
    _check_spec_payload(plain["metrics"]["speculative_decoding"], 10, 3)
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{live.url}/v1/completions", json=streamed, timeout=60) as response:
        events = sse_events(list(response.iter_lines()))
    last = events[-2]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 10
    _check_spec_payload(last["metrics"]["speculative_decoding"], 10, 3)
    assert all("metrics" not in e for e in events[:-2])  # only the final usage chunk
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "ignore_eos": True}
    answer = httpx.post(f"{live.url}/v1/chat/completions", json=chat, timeout=60).json()
    _check_spec_payload(answer["metrics"]["speculative_decoding"], 6, 3)
