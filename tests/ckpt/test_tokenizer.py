"""Tokenizer facts agree with the tokenizers library; vocabularies are compared, not sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ckpt_factory import tokenizers_dir, write_tokenizer
from tokenizers import Tokenizer

from spectool.ckpt.tokenizer import compare_vocabularies, load_tokenizer_facts
from spectool.errors import CheckpointError


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_vocab_equals_library(family: str) -> None:
    facts = load_tokenizer_facts(tokenizers_dir() / family)
    lib = Tokenizer.from_file(str(tokenizers_dir() / family / "tokenizer.json"))
    assert facts is not None
    assert facts.vocab == lib.get_vocab(with_added_tokens=True)
    specials = {t.content: i for i, t in lib.get_added_tokens_decoder().items() if t.special}
    assert facts.special_tokens == specials


def test_relations(tmp_path: Path) -> None:
    qwen3 = load_tokenizer_facts(tokenizers_dir() / "qwen3")
    llama3 = load_tokenizer_facts(tokenizers_dir() / "llama3")
    q25 = tmp_path / "q25"
    q25.mkdir()
    write_tokenizer(q25, "qwen3", 151665)
    qwen25 = load_tokenizer_facts(q25)
    assert compare_vocabularies(qwen3, qwen3).relation == "same"
    sup = compare_vocabularies(qwen3, qwen25)
    assert (sup.relation, sup.only_target, sup.conflicts) == ("target_superset", 4, 0)
    assert compare_vocabularies(qwen25, qwen3).relation == "drafter_superset"
    diff = compare_vocabularies(llama3, qwen3)
    assert diff.relation == "different" and diff.conflicts > 100_000 and "id" in diff.example


def test_malformed_tokenizer_json(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE"}}))
    with pytest.raises(CheckpointError, match="no vocab"):
        load_tokenizer_facts(tmp_path)
    (tmp_path / "tokenizer.json").write_text("[]")
    with pytest.raises(CheckpointError, match="JSON object"):
        load_tokenizer_facts(tmp_path)
    assert load_tokenizer_facts(tmp_path / "missing") is None


def test_a_large_tokenizer_is_decoded_once_per_content(tmp_path: Path, monkeypatch) -> None:
    """The same bytes in another folder are not decoded again (the facts name that folder's
    file); changed bytes, in tokenizer.json or tokenizer_config.json, are."""
    from spectool.ckpt import tokenizer

    monkeypatch.setattr(tokenizer, "_CACHE", {})
    monkeypatch.setattr(tokenizer, "_CACHE_MIN_BYTES", 10)
    decoded: list[Path] = []
    real = tokenizer._facts
    monkeypatch.setattr(tokenizer, "_facts", lambda p, *a: decoded.append(p) or real(p, *a))
    body = {"model": {"vocab": {"a": 0, "b": 1}}, "added_tokens": []}
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer.json").write_text(json.dumps(body))
    one = load_tokenizer_facts(tmp_path / "one")
    two = load_tokenizer_facts(tmp_path / "two")
    assert one is not None and two is not None and one.vocab == two.vocab == {"a": 0, "b": 1}
    assert two.path == tmp_path / "two" / "tokenizer.json" and len(decoded) == 1
    body["model"]["vocab"]["c"] = 2
    (tmp_path / "two" / "tokenizer.json").write_text(json.dumps(body))
    assert load_tokenizer_facts(tmp_path / "two").vocab["c"] == 2 and len(decoded) == 2
    (tmp_path / "two" / "tokenizer_config.json").write_text('{"eos_token": "c"}')
    assert load_tokenizer_facts(tmp_path / "two").eos_token == "c" and len(decoded) == 3
