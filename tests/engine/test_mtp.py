"""MTP through the proposer seam: lossless greedy decoding, the target's distribution when
sampling, and the loader's refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch  # noqa: TID253 (engine tests use torch throughout)

from spectool.engine.engine import Engine, EngineConfig, SamplingParams
from spectool.engine.load import load_model
from spectool.engine.mtp_module import load_mtp_module
from spectool.errors import CheckpointError, ConfigError

from .helpers import chi_square_pvalue, write_checkpoint, write_mtp_target
from .test_engine import (
    ENGINE_DRAWS,
    PROMPT,
    TINY_VOCAB,
    _exact_second_and_third,
    _pair_counts,
    _run_mix,
    _solo_outputs,
)


@pytest.fixture(scope="module")
def mtp_dir(tmp_path_factory: pytest.TempPathFactory, target_dir: Path) -> Path:
    """The 2-layer test target plus one random MTP module (DeepSeek-V3 layout, two shards)."""
    return write_mtp_target(tmp_path_factory.mktemp("mtp"), target_dir, seed=5)


def test_greedy_mtp_equals_baseline_with_joins_and_stops(target_dir: Path, mtp_dir: Path) -> None:
    """Requests joining mid-run, eos on and off, k = 1, 2, 4: the target's own output every
    time (the checkpoint's MTP layer is not part of the target's forward)."""
    baseline = _solo_outputs(Engine(target_dir, config=EngineConfig(method="none")))
    assert _solo_outputs(Engine(mtp_dir, config=EngineConfig(method="none"))) == baseline
    for k in (1, 2, 4):
        engine = Engine(
            mtp_dir, config=EngineConfig(method="mtp", max_draft_len=k, max_batch_size=4)
        )
        outputs, _ = _run_mix(engine)
        assert outputs == baseline, f"k={k}"
        stats = engine.drain_stats()
        assert max(len(s.drafted_per_pos) for s in stats) == k
        assert sum(s.num_draft_tokens for s in stats) > 0
        assert not engine._proposer.cache.used_slots  # type: ignore[union-attr]


# -- the target's distribution at temperature 1 ------------------------------------------------


@pytest.fixture(scope="module")
def tiny_mtp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A vocabulary-8 target (as test_engine's tiny pair) with a random MTP module."""
    root = tmp_path_factory.mktemp("tiny_mtp")
    target = write_checkpoint(root / "target", seed=11, vocab_size=TINY_VOCAB, init_range=0.3)
    return write_mtp_target(root / "mtp", target, seed=17, init_range=0.3)


def test_sampled_mtp_keeps_the_target_distribution(tiny_mtp: Path) -> None:
    """2000 seeded requests at temperature 1, k = 2: the second and third tokens follow the
    target's joint law (chi-square), while the module's own drafts, taken unverified, fail the
    same test (the negative control)."""
    engine = Engine(tiny_mtp, config=EngineConfig(method="mtp", max_draft_len=2, max_batch_size=64))
    params = [
        SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True, seed=s)
        for s in range(ENGINE_DRAWS)
    ]
    outputs = engine.generate([PROMPT] * ENGINE_DRAWS, params)
    stats = engine.drain_stats()
    drafted = sum(s.num_draft_tokens for s in stats)
    accepted = sum(s.num_accepted_tokens for s in stats)
    assert 0.1 * drafted < accepted < 0.9 * drafted  # many acceptances and many rejections
    counts = _pair_counts(outputs)
    exact = _exact_second_and_third(tiny_mtp)
    assert chi_square_pvalue(counts.sum(1), exact.sum(1)) > 1e-3
    assert chi_square_pvalue(counts, exact) > 1e-3
    assert chi_square_pvalue(_unverified_pairs(tiny_mtp), exact) < 1e-3


def _unverified_pairs(folder: Path) -> torch.Tensor:
    """(x2, x3) counts when x1 comes from the target (the prefill) and x2, x3 are the module's
    two sampled drafts, accepted as they are."""
    engine = Engine(
        folder,
        config=EngineConfig(
            method="mtp", max_draft_len=2, max_batch_size=ENGINE_DRAWS, max_seq_len=16
        ),
    )
    for s in range(ENGINE_DRAWS):
        engine.add_request(
            PROMPT, SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True, seed=s)
        )
    engine.step()  # prefill only: every request has its first token, none decoded yet
    batch = list(engine._running.values())
    proposer = engine._proposer
    assert proposer is not None and len(batch) == ENGINE_DRAWS
    with torch.inference_mode():
        drafts, q = proposer.propose(
            [r.slot for r in batch],
            [r.tokens for r in batch],
            [2] * len(batch),
            [r.row_sampling() for r in batch],
        )
    assert q is not None and bool((q.sum(-1) - 1).abs().max() < 1e-4)  # q over all 8 ids
    return _pair_counts([[r.tokens[-1], *d] for r, d in zip(batch, drafts, strict=True)])


# -- loading ----------------------------------------------------------------------------------


def _broken(
    tmp_path: Path, mtp_dir: Path, drop: str = "", add: str = "", config: dict | None = None
) -> Path:
    """A copy of ``mtp_dir`` with one MTP tensor dropped or one added, or config fields set."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / f"b{len(list(tmp_path.iterdir()))}"
    shutil.copytree(mtp_dir, folder)
    shard = folder / "model-00002-of-00002.safetensors"
    tensors = load_file(str(shard))
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    if drop:
        del tensors[drop], index["weight_map"][drop]
    if add:
        tensors[add] = torch.zeros(4)
        index["weight_map"][add] = shard.name
    save_file(tensors, str(shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(config or {})
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_loader_refuses_what_it_cannot_run(tmp_path: Path, target_dir: Path, mtp_dir: Path) -> None:
    target = load_model(target_dir)
    cpu = torch.device("cpu")
    layer = "model.layers.2."

    def load(folder: Path) -> object:
        return load_mtp_module(folder, target.args, target.output, cpu, torch.float32, 64)

    cases = [
        (
            _broken(tmp_path, mtp_dir, drop=layer + "hnorm.weight"),
            "lacks tensor model.layers.2.hnorm",
        ),
        (_broken(tmp_path, mtp_dir, add=layer + "mlp.gate.weight"), "unexpected tensor"),
        (_broken(tmp_path, mtp_dir, config={"num_nextn_predict_layers": 0}), "declares no MTP"),
        (_broken(tmp_path, mtp_dir, config={"num_nextn_predict_layers": "1"}), "not a count"),
    ]
    for folder, message in cases:
        with pytest.raises(CheckpointError, match=message):
            load(folder)
    # the shared copies are optional (TensorRT-LLM reads the target's own)
    bare = write_mtp_target(tmp_path / "bare", target_dir, seed=5, shared_copies=False)
    assert load(bare).eh_proj.weight.shape == (2 * 32, 32)  # type: ignore[attr-defined]
    with pytest.raises(CheckpointError, match="declares no MTP layers"):
        Engine(target_dir, config=EngineConfig(method="mtp"))
    with pytest.raises(ConfigError, match="only used with method"):
        Engine(mtp_dir, target_dir, EngineConfig(method="mtp"))


def test_target_loader_skips_only_declared_mtp_layers(tmp_path: Path, mtp_dir: Path) -> None:
    """A layer past num_hidden_layers is skipped when the config declares it as MTP, and is an
    unexpected tensor otherwise."""
    undeclared = _broken(tmp_path, mtp_dir, config={"num_nextn_predict_layers": 0})
    with pytest.raises(CheckpointError, match="tensors the llama model lacks"):
        load_model(undeclared)
    assert load_model(mtp_dir).args.n_layers == 2
