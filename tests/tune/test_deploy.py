"""The decision written through build's code: speculative.yaml per TensorRT-LLM release.

The decision comes from :func:`spectool.decide.tune.tune` over the decision tests' synthetic
world (known step costs and acceptance), tuned so that draft lengths 3, 2, 1 pay at growing
concurrency and speculation is off from 16 on; the pair is the tiny real checkpoint pair, the
GPU an H100 from spectool's table (no GPU or TensorRT-LLM needed to write configs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from spectool.decide.model import draft_len_for_batch
from spectool.decide.tune import TuneResult, tune
from spectool.deploy.manifest import read_manifest
from spectool.trtllm.releases import release_info
from spectool.trtllm.validate import validate_options
from spectool.tuning.deploy import write_deployment
from spectool.tuning.request import TuneRequest, resolve

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "decide"))
from world import World  # noqa: E402

CONCURRENCIES = (1, 2, 4, 8, 16, 32)


@pytest.fixture(scope="module")
def decided() -> TuneResult:
    world = World(per_draft_token_ms=1.0)
    result = tune(CONCURRENCIES, 3, world.measure, engine="trtllm", method="draft_model")
    assert result.choices == {1: 3, 2: 2, 4: 2, 8: 1, 16: 0, 32: 0}  # the world's known optimum
    return result


@pytest.mark.parametrize(("version", "release"), [("1.2.0", "1.2"), ("1.3.0", "main")])
def test_schedule_written_for_releases_with_draft_len_schedule(
    version: str,
    release: str,
    decided: TuneResult,
    tune_models: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    target, drafter = tune_models
    resolved = resolve(
        TuneRequest(
            target=str(target),
            drafter=str(drafter),
            engine="trtllm",
            gpu="H100",
            trtllm_version=version,
            max_draft_len=3,
            concurrencies=CONCURRENCIES,
            out=tmp_path,
        )
    )
    deployment = write_deployment(resolved, decided, tmp_path)
    options = yaml.safe_load((tmp_path / "speculative.yaml").read_text())
    validate_options(options, release, "pytorch")  # raises on anything the release refuses
    spec = options["speculative_config"]
    assert spec["max_draft_len"] == 3
    semantics = "up_to" if release_info(release).schedule_rule == "smallest_key" else "from"
    schedule = {int(b): int(k) for b, k in spec["draft_len_schedule"].items()}
    for c, k in decided.choices.items():
        assert draft_len_for_batch(schedule, c, semantics) == k
    baseline = yaml.safe_load((tmp_path / "baseline.yaml").read_text())
    validate_options(baseline, release, "pytorch")
    assert "speculative_config" not in baseline
    decision = json.loads((tmp_path / "decision.json").read_text())
    assert decision == decided.to_decision_json()
    assert read_manifest(tmp_path).decision is not None
    assert deployment.decision_path == tmp_path / "decision.json"


def test_max_concurrency_for_a_release_without_schedule(
    decided: TuneResult, tune_models: tuple[Path, Path], tmp_path: Path
) -> None:
    target, drafter = tune_models
    resolved = resolve(
        TuneRequest(
            target=str(target),
            drafter=str(drafter),
            engine="trtllm",
            gpu="H100",
            trtllm_version="1.1.0",
            max_draft_len=3,
            concurrencies=CONCURRENCIES,
            out=tmp_path,
        )
    )
    deployment = write_deployment(resolved, decided, tmp_path)
    options = yaml.safe_load((tmp_path / "speculative.yaml").read_text())
    validate_options(options, "1.1", "pytorch")
    spec = options["speculative_config"]
    assert "draft_len_schedule" not in spec
    assert spec["max_concurrency"] == 8  # the last concurrency that speculates
    assert any("no draft_len_schedule" in note for note in deployment.notes)
