"""Safetensors header reader: agrees with the safetensors library, refuses hostile files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

from spectool.ckpt.header import read_safetensors_folder, read_safetensors_header
from spectool.errors import CheckpointError

NP_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I8": np.int8, "U8": np.uint8}


def _write_raw(path: Path, header: bytes, data: bytes = b"", length: int | None = None) -> Path:
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)
    return path


def test_matches_safetensors_library(tmp_path: Path) -> None:
    tensors = {
        "a.weight": np.zeros((3, 4), np.float32),
        "b": np.zeros((7,), np.int64),
        "c": np.zeros((0, 5), np.float16),
    }
    save_file(tensors, tmp_path / "m.safetensors")
    ours = read_safetensors_header(tmp_path / "m.safetensors")
    with safe_open(tmp_path / "m.safetensors", framework="numpy") as f:
        theirs = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert {k: v.shape for k, v in ours.items()} == theirs
    assert ours["a.weight"].dtype == "F32" and ours["a.weight"].nbytes == 48


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.dictionaries(
        st.text(alphabet="abcdefghij._0123456789", min_size=1, max_size=12).filter(
            lambda s: s != "__metadata__"
        ),
        st.tuples(st.sampled_from(sorted(NP_DTYPES)), st.lists(st.integers(0, 5), max_size=3)),
        max_size=6,
    )
)
def test_property_roundtrip(tmp_path: Path, spec: dict) -> None:
    tensors = {k: np.zeros(tuple(shape), NP_DTYPES[d]) for k, (d, shape) in spec.items()}
    path = tmp_path / "p.safetensors"
    save_file(tensors, path)
    ours = read_safetensors_header(path)
    assert {k: (v.dtype, v.shape) for k, v in ours.items()} == {
        k: (d, tuple(shape)) for k, (d, shape) in spec.items()
    }


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=64))
def test_property_random_bytes_never_crash(tmp_path: Path, blob: bytes) -> None:
    path = tmp_path / "r.safetensors"
    path.write_bytes(blob)
    try:
        read_safetensors_header(path)
    except CheckpointError as exc:
        assert str(path) in str(exc)  # noqa: PT017 - most random inputs do raise, not all


@pytest.mark.parametrize(
    ("header", "length", "data", "problem"),
    [
        (
            b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}',
            10_000,
            b"",
            "truncated",
        ),
        (b"{}", 100 * 1024 * 1024 + 1, b"", "over the"),
        (b"[1, 2, 3]", None, b"", "not a JSON object"),
        (b"not json", None, b"", "not valid JSON"),
        (
            b'{"a": {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}}',
            None,
            b"\0" * 8,
            "unknown dtype",
        ),
        (
            b'{"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}',
            None,
            b"\0" * 8,
            "shape",
        ),
        (
            b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}',
            None,
            b"\0" * 8,
            "needs 16",
        ),
        (
            b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}',
            None,
            b"\0" * 4,
            "beyond the file",
        ),
        (b'{"a": 5}', None, b"", "not an object"),
    ],
)
def test_hostile_headers(
    tmp_path: Path, header: bytes, length: int | None, data: bytes, problem: str
) -> None:
    path = _write_raw(tmp_path / "h.safetensors", header, data, length)
    with pytest.raises(CheckpointError, match=problem) as info:
        read_safetensors_header(path)
    assert str(path) in str(info.value)


def test_too_short_file(tmp_path: Path) -> None:
    (tmp_path / "s.safetensors").write_bytes(b"\1\2")
    with pytest.raises(CheckpointError, match="too short"):
        read_safetensors_header(tmp_path / "s.safetensors")


def test_index_names_missing_shard_and_missing_tensor(tmp_path: Path) -> None:
    save_file({"a": np.zeros(2, np.float32)}, tmp_path / "s1.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
    with pytest.raises(CheckpointError, match="s2.safetensors"):
        read_safetensors_folder(tmp_path)
    index.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "zz": "s1.safetensors"}}))
    with pytest.raises(CheckpointError, match="'zz'"):
        read_safetensors_folder(tmp_path)
    index.write_text(json.dumps({"weight_map": {"a": "../s1.safetensors"}}))
    with pytest.raises(CheckpointError, match="plain file name"):
        read_safetensors_folder(tmp_path)
    index.write_text(json.dumps({"weight_map": {"a": "s1.safetensors"}}))
    assert read_safetensors_folder(tmp_path)["a"].shape == (2,)


def test_a_large_folder_is_read_again_only_when_a_file_changed(tmp_path: Path, monkeypatch) -> None:
    """Large folders are parsed once per process while their files are unchanged; a rewritten,
    added or removed file is read again, and the caller's dict is its own."""
    from spectool.ckpt import header

    monkeypatch.setattr(header, "_FOLDER_CACHE", {})
    monkeypatch.setattr(header, "_FOLDER_CACHE_MIN_TENSORS", 3)
    parsed: list[Path] = []
    real = header.read_safetensors_header
    monkeypatch.setattr(header, "read_safetensors_header", lambda p: parsed.append(p) or real(p))
    save_file({n: np.zeros(2, np.float32) for n in "abc"}, tmp_path / "m.safetensors")
    first = read_safetensors_folder(tmp_path)
    first.pop("a")  # the caller's copy: the cache keeps its own
    again = read_safetensors_folder(tmp_path)
    assert set(again) == {"a", "b", "c"} and len(parsed) == 1
    save_file({n: np.zeros(3, np.float32) for n in "abc"}, tmp_path / "m.safetensors")
    assert read_safetensors_folder(tmp_path)["a"].shape == (3,) and len(parsed) == 2
    save_file({"d": np.zeros(1, np.float32)}, tmp_path / "n.safetensors")
    assert "d" in read_safetensors_folder(tmp_path) and len(parsed) == 4
    (tmp_path / "n.safetensors").unlink()  # the files as they were two reads ago: kept
    assert "d" not in read_safetensors_folder(tmp_path) and len(parsed) == 4
    save_file({"a": np.zeros(2, np.float32)}, tmp_path / "m.safetensors")  # small: not kept
    read_safetensors_folder(tmp_path)
    assert read_safetensors_folder(tmp_path) == {"a": real(tmp_path / "m.safetensors")["a"]}
    assert len(parsed) == 6
