"""Issue 28's quiet acceptance killers, measured on the embedded engine: the shipped EAGLE-3 head
on the shipped target, against copies that carry exactly what ``check`` warns about. The
mismatched copy accepts measurably fewer drafts (greedy, so the counts are deterministic), the
shipped pair does not, and ``check`` warns about the copy and not about the shipped pair.

Families the demo pair cannot show: special tokens and chat templates (the demo models never
saw special tokens or chat text, spectool/assets/models/README.md), Medusa (the engine runs no
Medusa heads), quantisation (the engine does not quantise), another base model (there is one
demo target).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch  # noqa: TID253 (engine tests use torch throughout)
from safetensors.torch import load_file, save_file

from spectool.ckpt.inspect import inspect_folder
from spectool.ckpt.refs import builtin_path
from spectool.compat import check_pair
from spectool.engine.engine import Engine, EngineConfig, SamplingParams
from spectool.findings import Severity

DEMO_TARGET = builtin_path("demo-target")
DEMO_HEAD = builtin_path("demo-eagle3")


def _acceptance(target: Path, head: Path) -> float:
    """Accepted / drafted over 16 held-out prompts, 24 tokens each, k = 4 (a few seconds)."""
    text = (DEMO_TARGET.parent / "heldout_sample.txt").read_text(encoding="utf-8")
    engine = Engine(target, head, EngineConfig(method="eagle3", max_draft_len=4, max_batch_size=16))
    ids = engine.tokenizer.encode(text)
    prompts = [ids[i * 40 : i * 40 + 24 + i] for i in range(16)]
    engine.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    stats = engine.drain_stats()
    drafted = sum(s.num_draft_tokens for s in stats)
    assert drafted > 100
    return sum(s.num_accepted_tokens for s in stats) / drafted


def _warnings(target: Path, head: Path) -> set[str]:
    findings = check_pair(inspect_folder(target), inspect_folder(head), "eagle3")
    return {f.code for f in findings if f.severity is not Severity.INFO}


@pytest.fixture(scope="module")
def shipped_rate() -> float:
    """The shipped pair: check is silent, and the head's drafts are accepted often."""
    assert _warnings(DEMO_TARGET, DEMO_HEAD) == set()
    rate = _acceptance(DEMO_TARGET, DEMO_HEAD)
    assert rate > 0.3
    return rate


def _copy_with_config(src: Path, dest: Path, **changes: object) -> Path:
    dest.mkdir(parents=True)
    for path in src.iterdir():
        if path.name != "config.json":
            (dest / path.name).symlink_to(path)
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    (dest / "config.json").write_text(json.dumps({**config, **changes}), encoding="utf-8")
    return dest


def test_rope_scaling_the_head_was_not_trained_with(tmp_path: Path, shipped_rate: float) -> None:
    """ROPE_MISMATCH: the target scaled (linear x4), the head trained without it (it states
    rope_theta 10000 and no scaling): acceptance falls by a fifth."""
    scaled = _copy_with_config(
        DEMO_TARGET,
        tmp_path / "target-linear4",
        rope_parameters={"rope_theta": 10000.0, "rope_type": "linear", "factor": 4.0},
    )
    assert "ROPE_MISMATCH" in _warnings(scaled, DEMO_HEAD)
    rate = _acceptance(scaled, DEMO_HEAD)
    assert rate < 0.85 * shipped_rate, (rate, shipped_rate)


def test_draft_vocabulary_narrower_than_the_targets_tokens(
    tmp_path: Path, shipped_rate: float
) -> None:
    """DRAFT_VOCAB_NARROW: the head re-exported with 256 of its 1024 draft tokens (every
    fourth; 6% of the target's 4096): the tokens left out are always rejected."""
    weights = load_file(DEMO_HEAD / "model.safetensors")
    keep = torch.arange(0, 1024, 4)
    target_ids = (torch.arange(1024) + weights["d2t"])[keep]
    t2d = torch.zeros(4096, dtype=torch.bool)
    t2d[target_ids] = True
    narrow = {
        **weights,
        "d2t": (target_ids - torch.arange(len(keep))).contiguous(),
        "lm_head.weight": weights["lm_head.weight"][keep].contiguous(),
        "t2d": t2d,
    }
    head = tmp_path / "head-narrow"
    head.mkdir()
    save_file(narrow, head / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((DEMO_HEAD / "config.json").read_text(encoding="utf-8"))
    (head / "config.json").write_text(json.dumps({**config, "draft_vocab_size": len(keep)}))
    assert "DRAFT_VOCAB_NARROW" in _warnings(DEMO_TARGET, head)
    rate = _acceptance(DEMO_TARGET, head)
    assert rate < 0.6 * shipped_rate, (rate, shipped_rate)
