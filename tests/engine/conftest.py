"""Session-wide tiny checkpoints shared by the engine tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch  # noqa: TID253 (engine tests use torch throughout)

from .helpers import write_checkpoint

torch.set_num_threads(1)  # the test machine's cores are shared


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama target: GQA, untied, peaked logits (init 0.5) so greedy never meets near-ties."""
    return write_checkpoint(tmp_path_factory.mktemp("target"), seed=1)


@pytest.fixture(scope="session")
def drafter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A smaller Llama unrelated to the target (other seed, one layer): many rejections."""
    return write_checkpoint(
        tmp_path_factory.mktemp("drafter"),
        seed=2,
        num_layers=1,
        hidden_size=16,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=32,
    )


@pytest.fixture(scope="session")
def close_drafter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target's weights plus noise: accepts some drafts and rejects others."""
    return write_checkpoint(tmp_path_factory.mktemp("close_drafter"), seed=1, noise=0.25)
