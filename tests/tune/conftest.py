"""Tiny real checkpoints and a short workload for ``spectool tune``'s end-to-end tests.

The models come from the server tests' factory (``tests/server/conftest.py``): 2-layer random
Llamas, the drafter the target plus noise, so drafts are partly accepted. The workload is a
handful of short prompts so that a whole tune run (two concurrencies, draft lengths 0..2) takes
seconds.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SERVER_TESTS = Path(__file__).resolve().parents[1] / "server"


def _server_factory() -> ModuleType:
    """``tests/server/conftest.py`` loaded by path (that folder is not a package)."""
    name = "_server_tests_conftest"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SERVER_TESTS / "conftest.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tune_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target, drafter) folders: a tiny random Llama and the same weights plus noise."""
    factory = _server_factory()
    root = tmp_path_factory.mktemp("tune-models")
    target = factory.write_tiny_llama(root / "target", seed=3)
    drafter = factory.write_tiny_llama(root / "drafter", seed=3, noise=0.015)
    return target, drafter


@pytest.fixture(scope="session")
def tune_workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four short prompts (prompt JSONL)."""
    lines = [
        {"prompt": f"The draft model proposes {i} tokens and the target", "category": "t"}
        for i in range(4)
    ]
    path = tmp_path_factory.mktemp("tune-workload") / "prompts.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path
