"""EAGLE-3 through the proposer seam: lossless greedy decoding, exact sampling, rollback of the
head's KV cache, the head loader's refusals, and the shipped ``spectool:demo-eagle3``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch  # noqa: TID253 (engine tests use torch throughout)

from spectool.ckpt.refs import builtin_path
from spectool.engine.eagle3_head import default_capture_layers, load_eagle3_head
from spectool.engine.engine import Engine, EngineConfig, SamplingParams
from spectool.engine.load import load_model
from spectool.engine.model import make_step
from spectool.errors import CheckpointError, ConfigError

from .helpers import write_eagle3_head
from .test_engine import _run_mix, _solo_outputs

DEMO_TARGET = builtin_path("demo-target")
DEMO_HEAD = builtin_path("demo-eagle3")


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory: pytest.TempPathFactory, target_dir: Path) -> Path:
    """A random head for the 2-layer test target: reads both layers, drafts 48 of 64 ids."""
    return write_eagle3_head(
        tmp_path_factory.mktemp("head"), target_dir, seed=5, draft_vocab_size=48, layers=[0, 1]
    )


def test_greedy_eagle3_equals_baseline_with_joins_and_stops(
    target_dir: Path, head_dir: Path
) -> None:
    """Requests joining mid-run, eos on and off, k = 1..4: the target's own output every time,
    although this random head's drafts are nearly all rejected."""
    baseline = _solo_outputs(Engine(target_dir, config=EngineConfig(method="none")))
    for k in (1, 2, 4):
        engine = Engine(
            target_dir, head_dir, EngineConfig(method="eagle3", max_draft_len=k, max_batch_size=4)
        )
        outputs, _ = _run_mix(engine)
        assert outputs == baseline, f"k={k}"
        stats = engine.drain_stats()
        assert sum(s.num_draft_tokens for s in stats) > 0
        assert not engine._proposer.cache.used_slots  # type: ignore[union-attr]


def test_demo_eagle3_is_lossless_for_16_concurrent_prompts() -> None:
    """The shipped head on the demo target: 16 prompts decoded together equal plain decoding,
    and the trained head's drafts are accepted far more often than chance."""
    text = (DEMO_TARGET.parent / "heldout_sample.txt").read_text(encoding="utf-8")
    plain = Engine(DEMO_TARGET, config=EngineConfig(method="none", max_batch_size=16))
    ids = plain.tokenizer.encode(text)
    prompts = [ids[i * 40 : i * 40 + 24 + i] for i in range(16)]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    want = plain.generate(prompts, params)
    engine = Engine(
        DEMO_TARGET, DEMO_HEAD, EngineConfig(method="eagle3", max_draft_len=4, max_batch_size=16)
    )
    assert engine.generate(prompts, params) == want
    stats = engine.drain_stats()
    assert max(s.num_decoded_requests for s in stats) == 16
    accepted = sum(s.num_accepted_tokens for s in stats)
    drafted = sum(s.num_draft_tokens for s in stats)
    assert 0.25 * drafted < accepted < drafted


def _fresh_head_rows(
    engine: Engine, tokens: list[int], done: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Head keys/values of positions 0..done-1 computed from scratch: the target's features of
    the accepted text, paired with each next token, in one forward into a fresh cache."""
    proposer = engine._proposer
    head = proposer.model  # type: ignore[union-attr]
    target = engine.target
    with torch.inference_mode():
        _, feats = target(
            torch.tensor([tokens[:done]]),
            torch.arange(done)[None],
            hidden_layers=proposer.hidden_layers,  # type: ignore[union-attr]
        )
        cache = head.new_cache(1, 64)
        positions = torch.arange(done)[None]
        step = make_step(
            head.args, head.rope_cos_sin, positions, cache, torch.tensor([0]), head.lm_head.weight
        )
        embeds = target.tok_embeddings.weight[torch.tensor(tokens[1 : done + 1])]
        head.forward(embeds, feats[0], step)
    return cache.k[0, 0, :, :done], cache.v[0, 0, :, :done]


def test_head_cache_after_rejections_equals_a_fresh_run() -> None:
    """After every step the head's cache holds exactly what the target's features of the
    accepted text give (drafted positions rolled back and re-fed from the verify pass), and
    fed + queued features always equal the target cache's length."""
    engine = Engine(
        DEMO_TARGET, DEMO_HEAD, EngineConfig(method="eagle3", max_draft_len=4, max_seq_len=64)
    )
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
            want_k, want_v = _fresh_head_rows(engine, request.tokens, done)
            got_k = proposer.cache.k[0, slot, :, :done]  # type: ignore[union-attr]
            got_v = proposer.cache.v[0, slot, :, :done]  # type: ignore[union-attr]
            assert torch.allclose(got_k, want_k, atol=1e-4, rtol=1e-4)
            assert torch.allclose(got_v, want_v, atol=1e-4, rtol=1e-4)
            checked += 1
    assert rejected > 0 and checked > 4


def test_draft_length_switch_idles_the_head(target_dir: Path, head_dir: Path) -> None:
    engine = Engine(target_dir, head_dir, EngineConfig(method="eagle3", max_draft_len=3))
    baseline = _solo_outputs(Engine(target_dir, config=EngineConfig(method="none")))
    for k in (0, 2, 3):
        engine.set_draft_len(k)
        engine.drain_stats()
        assert _solo_outputs(engine) == baseline
        stats = [s for s in engine.drain_stats() if s.num_decoded_requests]
        assert {s.draft_len for s in stats} == {k}
        assert (sum(s.num_draft_tokens for s in stats) > 0) == (k > 0)
        assert not engine._proposer.cache.used_slots  # type: ignore[union-attr]


def test_head_loader_refuses_what_it_cannot_run(
    tmp_path: Path, target_dir: Path, head_dir: Path
) -> None:
    args = load_model(target_dir).args
    cpu = torch.device("cpu")

    def broken(change: dict | None = None, drop: str | None = None) -> Path:
        folder = tmp_path / f"h{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        config = json.loads((head_dir / "config.json").read_text())
        config.update(change or {})
        (folder / "config.json").write_text(json.dumps(config))
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(head_dir / "model.safetensors"))
        tensors.pop(drop or "", None)
        save_file(tensors, str(folder / "model.safetensors"))
        return folder

    cases = [
        (broken(drop="midlayer.hidden_norm.weight"), "lacks tensor"),
        (broken({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2]}}), "distinct"),
        (broken({"eagle_config": {}}), "too shallow"),  # 2 layers: no default capture
        (broken({"vocab_size": 65}), "vocab_size 65"),
        (broken({"num_hidden_layers": 2}), "1 decoder layer"),
    ]
    for folder, message in cases:
        with pytest.raises(CheckpointError, match=message):
            load_eagle3_head(folder, args, cpu, torch.float32, 64)
    assert default_capture_layers(12) == (1, 5, 8)
    with pytest.raises(ConfigError, match="needs a drafter checkpoint"):
        Engine(target_dir, config=EngineConfig(method="eagle3"))


# -- the shipped head, as spectool check sees it ----------------------------------------------


def _findings(method: str) -> tuple[str, set[str], set[str]]:
    """What ``spectool check spectool:demo-target spectool:demo-eagle3 --engine none --method
    METHOD`` rules, through the same calls (resolved method, error codes, all codes)."""
    from spectool.ckpt.refs import resolve_checkpoint
    from spectool.compat import check_pair, resolve_method

    target = resolve_checkpoint("spectool:demo-target")
    head = resolve_checkpoint("spectool:demo-eagle3")
    assert head.kind == "eagle3"  # from its tensors: midlayer.*, d2t, fc 3 x hidden
    resolved = resolve_method(method, target, head)
    findings = check_pair(target, head, resolved)
    errors = {f.code for f in findings if f.severity == "error"}
    return resolved, errors, {f.code for f in findings}


def test_check_classifies_demo_eagle3_from_its_tensors() -> None:
    method, errors, _ = _findings("auto")
    assert method == "eagle3" and not errors
    _, errors, _ = _findings("eagle")
    assert "WRONG_EAGLE_GENERATION_EAGLE3_AS_EAGLE1" in errors
    _, errors, _ = _findings("draft_model")
    assert "NOT_A_STANDALONE_LM" in errors


def test_shipped_head_layout_matches_the_published_ones() -> None:
    from safetensors import safe_open

    config = json.loads((DEMO_HEAD / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 5, 8]
    with safe_open(str(DEMO_HEAD / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
        dtypes = {f.get_tensor(n).dtype for n in names - {"d2t", "t2d"}}
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= names
    assert any(n.startswith("midlayer.") for n in names)
    assert not any(n.startswith("embed_tokens") for n in names)
    assert dtypes == {torch.float16} and d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    target_ids = torch.arange(config["draft_vocab_size"]) + d2t
    assert t2d.sum() == config["draft_vocab_size"] and bool(t2d[target_ids].all())
    assert sum(p.stat().st_size for p in DEMO_HEAD.iterdir()) < 6_000_000
