"""A real spectool server (embedded engine, tiny random Llama target + drafter) on 127.0.0.1.

The models and tokenizer come from the server tests' factory (``tests/server/conftest.py``) and
the server is started by their helper (``tests/server/server_helpers.py``): uvicorn on a thread
of the test process, on a free port. Speculation is on (``draft_model``, k = 3) so ``/metrics``
carries ``specDecodingStats`` and ``spectoolStats``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from spectool.measure.client import StreamingClient, StreamResult, tokenizer_counter
from spectool.measure.runner import TrialConfig, TrialResult, run_trials
from spectool.measure.workload_files import load_workload_file
from spectool.measure.workloads import Prompt, workload_id

SERVER_TESTS = Path(__file__).resolve().parents[1] / "server"
MODEL_NAME = "tiny-llama"
DRAFT_LEN = 3
MAX_BATCH_SIZE = 8


def _server_tests_module(name: str) -> ModuleType:
    """A module of the server suite (``tests/server/NAME.py``) loaded by path: that folder is
    not a package and is only on ``sys.path`` when pytest collects it."""
    module_name = f"_server_tests_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, SERVER_TESTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def measure_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target, drafter): the drafter is the target plus noise, so drafts are partly accepted."""
    factory = _server_tests_module("conftest")
    root = tmp_path_factory.mktemp("measure-models")
    target = factory.write_tiny_llama(root / "target", seed=1)
    drafter = factory.write_tiny_llama(root / "drafter", seed=1, noise=0.015)
    return target, drafter


@pytest.fixture(scope="session")
def server_url(measure_models: tuple[Path, Path]) -> Iterator[str]:
    """Base URL of a running spectool server (the server suite's live-server helper)."""
    from spectool.engine.engine import Engine, EngineConfig
    from spectool.server.app import create_app

    target, drafter = measure_models
    config = EngineConfig(
        method="draft_model",
        max_draft_len=DRAFT_LEN,
        max_batch_size=MAX_BATCH_SIZE,
        max_seq_len=256,
    )
    app = create_app(lambda: Engine(target, drafter, config), model_name=MODEL_NAME)
    live = _server_tests_module("server_helpers").start_live_server(app)
    yield live.url
    live.stop()


# -- trials shared by the runner and server-stats tests -------------------------------------------

MAX_TOKENS = 16
SHORT = 5  # the one prompt that carries its own max_tokens


class Recorder:
    """Progress hooks that remember every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def on_trial_start(self, config: TrialConfig, num_requests: int) -> None:
        self.calls.append(("start", (config.label, num_requests)))

    def on_request_done(self, config: TrialConfig, result: StreamResult) -> None:
        self.calls.append(("request", (config.label, result.record.request_id)))

    def on_trial_done(self, result: TrialResult) -> None:
        self.calls.append(("done", result.config.label))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.calls]


def trial_config(prompts: Sequence[Prompt], label: str, **kwargs: Any) -> TrialConfig:
    """A trial over all ``prompts`` with :data:`MAX_TOKENS` tokens each unless told otherwise."""
    values: dict[str, Any] = {
        "num_prompts": len(prompts),
        "max_tokens": MAX_TOKENS,
        "workload_id": workload_id(prompts),
    }
    values.update(kwargs)
    return TrialConfig(label, **values)


def run_with_client(
    url: str,
    coro_fn: Callable[..., Awaitable[Any]],
    *args: Any,
    count_tokens: Callable[[str], int] | None = None,
    **kwargs: Any,
) -> Any:
    """``await coro_fn(client, *args, **kwargs)`` with a fresh client, from synchronous code."""

    async def main() -> Any:
        async with StreamingClient(url, MODEL_NAME, count_tokens=count_tokens) as client:
            return await coro_fn(client, *args, **kwargs)

    return asyncio.run(main())


@pytest.fixture(scope="session")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> list[Prompt]:
    """Six short prompts from a prompt JSONL file, one with its own output length."""
    lines = [
        {"prompt": f"The target verifies {i} tokens and the draft model", "category": "c"}
        for i in range(5)
    ]
    lines.append({"prompt": "Speculative decoding trades compute", "max_tokens": SHORT})
    path = tmp_path_factory.mktemp("workload") / "prompts.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return load_workload_file(path)


@pytest.fixture(scope="session")
def ladder(
    server_url: str,
    prompts: list[Prompt],
    measure_models: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[list[TrialConfig], list[TrialResult], Path, Recorder]:
    """Concurrency 1 and 4 (two warmup requests each), saved to a results file; chunk tokens
    counted with the target's tokenizer when the server sends no per-chunk usage."""
    configs = [
        trial_config(prompts, "c1", concurrency=1, warmup_requests=2),
        trial_config(prompts, "c4", concurrency=4, warmup_requests=2),
    ]
    path = tmp_path_factory.mktemp("results") / "trials.jsonl"
    recorder = Recorder()
    results = run_with_client(
        server_url,
        run_trials,
        prompts,
        configs,
        count_tokens=tokenizer_counter(measure_models[0]),
        results_path=path,
        progress=recorder,
        metrics_interval_s=0.2,
    )
    return configs, results, path, recorder
