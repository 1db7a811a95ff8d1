"""MTP through the proposer seam: lossless greedy decoding, the target's distribution when
sampling, rollback of the module's KV cache, the loader's refusals, and the shipped
``spectool:demo-target-mtp``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch  # noqa: TID253 (engine tests use torch throughout)

from spectool.ckpt.refs import builtin_path
from spectool.engine.engine import Engine, EngineConfig, SamplingParams
from spectool.engine.load import load_model
from spectool.engine.model import make_step
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

DEMO_TARGET = builtin_path("demo-target")
DEMO_MTP = builtin_path("demo-target-mtp")


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


def test_demo_mtp_is_lossless_for_16_concurrent_prompts() -> None:
    """The shipped module on the demo target: 16 prompts decoded together equal plain decoding,
    and the trained module's drafts are accepted far more often than chance."""
    text = (DEMO_TARGET.parent / "heldout_sample.txt").read_text(encoding="utf-8")
    plain = Engine(DEMO_TARGET, config=EngineConfig(method="none", max_batch_size=16))
    ids = plain.tokenizer.encode(text)
    prompts = [ids[i * 40 : i * 40 + 24 + i] for i in range(16)]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    want = plain.generate(prompts, params)
    engine = Engine(DEMO_MTP, config=EngineConfig(method="mtp", max_draft_len=3, max_batch_size=16))
    assert engine.generate(prompts, params) == want
    stats = engine.drain_stats()
    assert max(s.num_decoded_requests for s in stats) == 16
    accepted = sum(s.num_accepted_tokens for s in stats)
    drafted = sum(s.num_draft_tokens for s in stats)
    assert 0.3 * drafted < accepted < drafted


def _fresh_module_rows(engine: Engine, tokens: list[int], done: int) -> tuple:
    """Module keys/values of positions 0..done-1 computed from scratch: the target's
    final-normed hidden states of the accepted text, each with the next token, in one forward
    into a fresh cache."""
    proposer = engine._proposer
    module = proposer.model  # type: ignore[union-attr]
    target = engine.target
    with torch.inference_mode():
        _, feats = target(
            torch.tensor([tokens[:done]]),
            torch.arange(done)[None],
            hidden_layers=proposer.hidden_layers,  # type: ignore[union-attr]
        )
        cache = module.new_cache(1, 64)
        positions = torch.arange(done)[None]
        step = make_step(
            module.args,
            module.rope_cos_sin,
            positions,
            cache,
            torch.tensor([0]),
            module.eh_proj.weight,
        )
        embeds = target.tok_embeddings.weight[torch.tensor(tokens[1 : done + 1])]
        module.forward(embeds, target.norm(feats[0]), step)
    return cache.k[0, 0, :, :done], cache.v[0, 0, :, :done]


def test_module_cache_after_rejections_equals_a_fresh_run() -> None:
    """After every step the module's cache holds exactly what the target's hidden states of
    the accepted text give (the chain's positions rolled back, verified ones re-fed), and fed +
    queued positions always equal the target cache's length."""
    engine = Engine(DEMO_MTP, config=EngineConfig(method="mtp", max_draft_len=4, max_seq_len=64))
    ids = engine.tokenizer.encode("def main(argv):\n    parser = argparse.ArgumentParser(")
    engine.add_request(ids, SamplingParams(max_tokens=24, ignore_eos=True))
    engine.add_request(ids[:7], SamplingParams(max_tokens=18, ignore_eos=True))
    proposer = engine._proposer
    rejected = checked = 0
    while engine.has_work():
        engine.step()
        stats = engine.drain_stats()[-1]
        rejected += stats.num_draft_tokens - stats.num_accepted_tokens
        for request in engine._running.values():
            slot = request.slot
            done = proposer.done[slot]  # type: ignore[union-attr]
            queued = sum(p.shape[0] for p in proposer.pending[slot])  # type: ignore[union-attr]
            assert done + queued == engine._cache.lengths[slot] == len(request.tokens) - 1
            assert proposer.cache.lengths[slot] == done  # type: ignore[union-attr]
            want_k, want_v = _fresh_module_rows(engine, request.tokens, done)
            assert torch.allclose(proposer.cache.k[0, slot, :, :done], want_k, atol=1e-4)  # type: ignore[union-attr]
            assert torch.allclose(proposer.cache.v[0, slot, :, :done], want_v, atol=1e-4)  # type: ignore[union-attr]
            checked += 1
    assert rejected > 0 and checked > 4


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


# -- the shipped model ---------------------------------------------------------------------------


def test_demo_target_mtp_has_deepseek_v3_layout() -> None:
    """The assembled checkpoint: demo-target's config plus num_nextn_predict_layers, the module
    as layer 12 with DeepSeek-V3's names in a second shard, its shared copies equal to the
    target's embedding; shipped packed in well under 1 MB, assembled once."""
    from safetensors import safe_open

    config = json.loads((DEMO_MTP / "config.json").read_text())
    target_config = json.loads((DEMO_TARGET / "config.json").read_text())
    assert config == {**target_config, "num_nextn_predict_layers": 1}
    index = json.loads((DEMO_MTP / "model.safetensors.index.json").read_text())
    module = {n for n, f in index["weight_map"].items() if n.startswith("model.layers.12.")}
    assert {
        "model.layers.12." + n
        for n in (
            "enorm.weight",
            "hnorm.weight",
            "eh_proj.weight",
            "input_layernorm.weight",
            "self_attn.q_proj.weight",
            "mlp.down_proj.weight",
            "shared_head.norm.weight",
            "shared_head.head.weight",
            "embed_tokens.weight",
        )
    } <= module
    assert {index["weight_map"][n] for n in module} == {"model-00002-of-00002.safetensors"}
    with (
        safe_open(str(DEMO_MTP / "model-00002-of-00002.safetensors"), "pt") as f,
        safe_open(str(DEMO_TARGET / "model.safetensors"), "pt") as t,
    ):
        embed = t.get_tensor("model.embed_tokens.weight")
        assert torch.equal(f.get_tensor("model.layers.12.shared_head.head.weight"), embed)
        assert f.get_slice("model.layers.12.eh_proj.weight").get_shape() == [256, 512]
    packed = DEMO_TARGET.parent / "demo-target-mtp"
    assert (packed / "mtp.safetensors").stat().st_size < 400_000
    assert not (packed / "model.safetensors").exists()
    assert builtin_path("demo-target-mtp") == DEMO_MTP  # reused, not written again
