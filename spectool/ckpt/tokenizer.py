"""Tokenizer facts for comparing token spaces: token -> id maps and special tokens.

Compare vocabularies, not sizes: the same tokenizer hides behind different ``vocab_size``
values (padded embeddings), and different tokenizers can share a size.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from spectool.ckpt.jsonfile import parse_json_object, read_capped
from spectool.constants import MAX_TOKENIZER_BYTES
from spectool.errors import CheckpointError


@dataclass(frozen=True)
class TokenizerFacts:
    """A tokenizer's full token -> id map (added tokens included) and its special tokens."""

    path: Path
    vocab: dict[str, int] = field(repr=False)
    special_tokens: dict[str, int]
    bos_token: str | None = None
    eos_token: str | None = None

    @property
    def size(self) -> int:
        return len(self.vocab)

    @property
    def max_id(self) -> int:
        return max(self.vocab.values(), default=-1)


# Large tokenizers decoded in this process, by the SHA-256 of their bytes: decoding a
# multi-megabyte tokenizer.json costs ~10x hashing it, and a process that inspects models of
# one family again (tests; tune and build run check) decodes each tokenizer once. The facts
# are only read; a hit is returned with the caller's path.
_CACHE: dict[tuple[str, str | None], TokenizerFacts] = {}
_CACHE_SIZE = 4
_CACHE_MIN_BYTES = 1 << 20


def load_tokenizer_facts(folder: Path) -> TokenizerFacts | None:
    """Read ``tokenizer.json`` (+ ``tokenizer_config.json``) of a folder; None when absent."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    raw = read_capped(path, MAX_TOKENIZER_BYTES)
    config_path = folder / "tokenizer_config.json"
    config_raw = read_capped(config_path) if config_path.is_file() else None
    key = (
        hashlib.sha256(raw).hexdigest(),
        hashlib.sha256(config_raw).hexdigest() if config_raw is not None else None,
    )
    if key in _CACHE:
        return replace(_CACHE[key], path=path)
    facts = _facts(path, raw, config_path, config_raw)
    if len(raw) >= _CACHE_MIN_BYTES:
        while len(_CACHE) >= _CACHE_SIZE:
            del _CACHE[next(iter(_CACHE))]  # the oldest
        _CACHE[key] = facts
    return facts


def _facts(path: Path, raw: bytes, config_path: Path, config_raw: bytes | None) -> TokenizerFacts:
    data = parse_json_object(raw, path)
    vocab, special = _vocab_from_tokenizer_json(data, path)
    bos = eos = None
    if config_raw is not None:
        config = parse_json_object(config_raw, config_path)
        bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
    return TokenizerFacts(
        path=path, vocab=vocab, special_tokens=special, bos_token=bos, eos_token=eos
    )


def _vocab_from_tokenizer_json(
    data: dict[str, object], path: Path
) -> tuple[dict[str, int], dict[str, int]]:
    """token -> id (what ``tokenizers.Tokenizer.get_vocab(with_added_tokens=True)`` returns)
    and the special added tokens, read from the JSON directly: ten times faster than building
    the tokenizer, which matters on the ``check`` path."""
    model = data.get("model")
    if not isinstance(model, dict):
        raise CheckpointError(path, "tokenizer.json has no 'model' object")
    raw = model.get("vocab")
    vocab: dict[str, int] = {}
    if isinstance(raw, dict):  # BPE, WordPiece, WordLevel
        for token, i in raw.items():
            if not isinstance(i, int):
                raise CheckpointError(path, f"vocab entry {token!r} has a non-integer id")
            vocab[token] = i
    elif isinstance(raw, list):  # Unigram: [[piece, score], ...], id = position
        for i, entry in enumerate(raw):
            if not (isinstance(entry, list) and entry and isinstance(entry[0], str)):
                raise CheckpointError(path, f"unigram vocab entry {i} is malformed")
            vocab[entry[0]] = i
    else:
        raise CheckpointError(path, "tokenizer.json model has no vocab")
    special: dict[str, int] = {}
    added = data.get("added_tokens") or []
    if not isinstance(added, list):
        raise CheckpointError(path, "added_tokens is not a list")
    for entry in added:
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("content"), str)
            and isinstance(entry.get("id"), int)
        ):
            raise CheckpointError(path, f"malformed added token {entry!r}"[:200])
        vocab[entry["content"]] = entry["id"]
        if entry.get("special"):
            special[entry["content"]] = entry["id"]
    return vocab, special


def _token_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


@dataclass(frozen=True)
class VocabComparison:
    """How two token -> id maps relate.

    ``relation``: ``same``; ``target_superset`` (every drafter token has the same id in the
    target, which has more); ``drafter_superset`` (the converse); ``different`` (some id names
    different tokens on the two sides, or each side has tokens the other lacks).
    """

    relation: str
    conflicts: int
    only_target: int
    only_drafter: int
    example: str = ""


def compare_vocabularies(target: TokenizerFacts, drafter: TokenizerFacts) -> VocabComparison:
    t_by_id = {i: tok for tok, i in target.vocab.items()}
    d_by_id = {i: tok for tok, i in drafter.vocab.items()}
    conflicts = 0
    example = ""
    for i, tok in d_by_id.items():
        other = t_by_id.get(i)
        if other is not None and other != tok:
            conflicts += 1
            if not example:
                example = f"id {i} is {other!r} in the target but {tok!r} in the drafter"
    only_t = len(t_by_id.keys() - d_by_id.keys())
    only_d = len(d_by_id.keys() - t_by_id.keys())
    if conflicts or (only_t and only_d):
        relation = "different"
    elif only_t:
        relation = "target_superset"
    elif only_d:
        relation = "drafter_superset"
    else:
        relation = "same"
    return VocabComparison(relation, conflicts, only_t, only_d, example)
