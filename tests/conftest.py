"""Shared fixtures: real checkpoint folders built from tests/fixtures (once per session)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ckpt_factory import CKPT_FIXTURES, build_checkpoint


@pytest.fixture(scope="session")
def expected_pairs() -> list[dict]:
    return json.loads((CKPT_FIXTURES / "expected_pairs.json").read_text())["pairs"]


@pytest.fixture(scope="session")
def ckpt_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ckpts")


@pytest.fixture(scope="session")
def make_ckpt(ckpt_root: Path):
    """repo id -> folder of a real (sparse) checkpoint built from tests/fixtures."""
    built: dict[str, Path] = {}

    def make(repo_id: str) -> Path:
        if repo_id not in built:
            built[repo_id] = build_checkpoint(repo_id, ckpt_root)
        return built[repo_id]

    return make
