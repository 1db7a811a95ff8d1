"""The restricted torch reader gets names and shapes and never runs code from the file."""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectool.ckpt.torch_bin import read_torch_bin
from spectool.errors import CheckpointError


def test_reads_real_state_dicts(tmp_path: Path) -> None:
    state = {
        "fc.weight": torch.zeros(8, 24, dtype=torch.float16),
        "d2t": torch.zeros(5, dtype=torch.int64),
        "t2d": torch.zeros(11, dtype=torch.bool),
        "norm.weight": torch.nn.Parameter(torch.zeros(8, dtype=torch.bfloat16)),
        "big": torch.zeros(1, dtype=torch.float32).expand(4096, 12288),
    }
    torch.save(state, tmp_path / "pytorch_model.bin")
    got = read_torch_bin(tmp_path / "pytorch_model.bin")
    assert {k: (v.dtype, v.shape) for k, v in got.items()} == {
        "fc.weight": ("F16", (8, 24)),
        "d2t": ("I64", (5,)),
        "t2d": ("BOOL", (11,)),
        "norm.weight": ("BF16", (8,)),
        "big": ("F32", (4096, 12288)),
    }


def test_medusa_module_list_state_dict(tmp_path: Path) -> None:
    heads = torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 10, bias=False))
        for _ in range(3)
    )
    torch.save(heads.state_dict(), tmp_path / "medusa_lm_head.pt")
    got = read_torch_bin(tmp_path / "medusa_lm_head.pt")
    assert got["2.1.weight"].shape == (10, 4) and len(got) == 9


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_hostile_pickle_is_refused_and_not_executed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps({"x": _Evil()}, protocol=2))
        zf.writestr("archive/data/0", b"")
    (tmp_path / "evil.bin").write_bytes(buf.getvalue())
    with pytest.raises(CheckpointError, match="refusing global"):
        read_torch_bin(tmp_path / "evil.bin")
    assert not (tmp_path / "PWNED").exists()


def test_legacy_and_garbage_files(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy.bin"
    torch.save({"a": torch.zeros(2)}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match="legacy"):
        read_torch_bin(legacy)
    (tmp_path / "junk.bin").write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(CheckpointError):
        read_torch_bin(tmp_path / "junk.bin")


def test_not_a_state_dict(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps([1, 2, 3], protocol=2))
    (tmp_path / "list.bin").write_bytes(buf.getvalue())
    with pytest.raises(CheckpointError, match="not a state dict"):
        read_torch_bin(tmp_path / "list.bin")


_TORCH_DTYPES = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "BOOL": torch.bool,
    "U8": torch.uint8,
}


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.dictionaries(
        st.text(alphabet="abcdefgh._0123456789", min_size=1, max_size=10),
        st.tuples(st.sampled_from(sorted(_TORCH_DTYPES)), st.lists(st.integers(0, 6), max_size=3)),
        max_size=5,
    )
)
def test_property_roundtrip_with_torch_save(tmp_path: Path, spec: dict) -> None:
    state = {k: torch.zeros(tuple(shape), dtype=_TORCH_DTYPES[d]) for k, (d, shape) in spec.items()}
    path = tmp_path / "p.bin"
    torch.save(state, path)
    got = read_torch_bin(path)
    assert {k: (v.dtype, v.shape) for k, v in got.items()} == {
        k: (d, tuple(s)) for k, (d, s) in spec.items()
    }
