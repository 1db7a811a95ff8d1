"""The embedded-engine driver against its real worker process: a server per k, and failures."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from spectool.errors import ChildProcessError_
from spectool.tuning.torch_driver import TorchDriver


def _driver(target: Path, drafter: Path, log: Path) -> TorchDriver:
    return TorchDriver(
        target,
        drafter,
        "draft_model",
        model_name="tiny",
        max_batch_size=4,
        max_seq_len=128,
        device="cpu",
        dtype="float32",
        threads=1,
        log_path=log,
        ready_timeout_s=120.0,
    )


def test_one_server_per_draft_length(tune_models: tuple[Path, Path], tmp_path: Path) -> None:
    target, drafter = tune_models
    with _driver(target, drafter, tmp_path / "server.log") as driver:
        first = driver.serve(2)
        assert first.k == 2 and first.ready_s > 0
        assert httpx.get(first.base_url + "/health").status_code == 200
        again = driver.serve(2)  # the running server: no start
        assert (again.base_url, again.ready_s, driver.starts) == (first.base_url, 0.0, 1)
        base = driver.serve(0)
        assert base.k == 0 and driver.starts == 2
        assert httpx.get(base.base_url + "/health").status_code == 200


def test_a_model_that_fails_to_load_is_a_child_error(
    tune_models: tuple[Path, Path], tmp_path: Path
) -> None:
    target, drafter = tune_models
    broken = tmp_path / "broken"
    shutil.copytree(target, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated
    with _driver(broken, drafter, tmp_path / "server.log") as driver:
        with pytest.raises(ChildProcessError_, match="could not serve k=0: .*failed to load"):
            driver.serve(0)
        assert driver.starts == 0
