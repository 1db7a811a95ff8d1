"""Safetensors headers (single file or sharded index) read without touching tensor data.

The format: 8 bytes little-endian header length N, N bytes of JSON mapping each tensor name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the end of the header)
plus an optional ``__metadata__`` string map. Everything is validated against the file size
before it is trusted: a hostile header cannot make us allocate more than the cap, and a truncated
file is named as such.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from spectool.ckpt.jsonfile import DEPTH_SCAN_BYTES, nesting_exceeds, read_json_object
from spectool.ckpt.tensors import DTYPE_BYTES, TensorInfo
from spectool.constants import MAX_JSON_DEPTH, MAX_SAFETENSORS_HEADER_BYTES
from spectool.errors import CheckpointError

INDEX_NAME = "model.safetensors.index.json"


def parse_header_json(
    raw: bytes, where: str | Path, data_size: int | None
) -> dict[str, TensorInfo]:
    """Validate a header's JSON bytes into tensors; ``data_size`` bounds the offsets if known."""
    too_deep = CheckpointError(where, f"safetensors header nested deeper than {MAX_JSON_DEPTH}")
    if len(raw) <= DEPTH_SCAN_BYTES and nesting_exceeds(raw, MAX_JSON_DEPTH):
        raise too_deep
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(where, f"safetensors header is not valid JSON ({exc})") from None
    except RecursionError:
        raise too_deep from None
    if not isinstance(header, dict):
        raise CheckpointError(where, "safetensors header is not a JSON object")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            if entry is not None and not isinstance(entry, dict):
                raise CheckpointError(where, "safetensors __metadata__ is not an object")
            continue
        tensors[name] = _tensor_entry(name, entry, where, data_size)
    return tensors


def _tensor_entry(name: str, entry: object, where: str | Path, data_size: int | None) -> TensorInfo:
    if not isinstance(entry, dict):
        raise CheckpointError(where, f"tensor {name!r}: entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise CheckpointError(where, f"tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise CheckpointError(where, f"tensor {name!r}: shape {shape!r} is not a list of sizes")
    info = TensorInfo(name=name, dtype=dtype, shape=tuple(shape), file=Path(str(where)).name)
    if offsets is not None:
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise CheckpointError(where, f"tensor {name!r}: bad data_offsets {offsets!r}")
        if offsets[1] - offsets[0] != info.nbytes:
            raise CheckpointError(
                where,
                f"tensor {name!r}: data_offsets span {offsets[1] - offsets[0]} bytes but "
                f"{dtype} x {list(shape)} needs {info.nbytes}",
            )
        if data_size is not None and offsets[1] > data_size:
            raise CheckpointError(
                where,
                f"tensor {name!r}: data ends at byte {offsets[1]} beyond the file (truncated?)",
            )
    return info


def read_safetensors_header(path: str | Path) -> dict[str, TensorInfo]:
    """Read one ``.safetensors`` file's header: tensor name -> :class:`TensorInfo`."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise CheckpointError(
                    path, f"file is {size} bytes, too short for a safetensors header"
                )
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_SAFETENSORS_HEADER_BYTES:
                raise CheckpointError(
                    path,
                    f"safetensors header claims {n} bytes, over the {MAX_SAFETENSORS_HEADER_BYTES} "
                    "byte limit (hostile or corrupt file)",
                )
            if n > size - 8:
                raise CheckpointError(
                    path,
                    f"safetensors header claims {n} bytes but the file has {size - 8} after "
                    "the length field (truncated?)",
                )
            raw = f.read(n)
    except OSError as exc:
        raise CheckpointError(path, f"cannot read: {exc.strerror or exc}") from None
    return parse_header_json(raw, path, size - 8 - n)


def read_safetensors_folder(folder: Path) -> dict[str, TensorInfo]:
    """All tensors of a folder: through ``model.safetensors.index.json`` when present (every
    listed tensor must be in the shard the index names), else every ``*.safetensors`` file."""
    index_path = folder / INDEX_NAME
    tensors: dict[str, TensorInfo] = {}
    if index_path.is_file():
        index = read_json_object(index_path)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise CheckpointError(index_path, "weight_map is missing or not a name -> file map")
        shards: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            if Path(shard).name != shard:
                raise CheckpointError(index_path, f"shard name {shard!r} is not a plain file name")
            shards.setdefault(shard, []).append(name)
        for shard, names in sorted(shards.items()):
            shard_path = folder / shard
            if not shard_path.exists():
                raise CheckpointError(index_path, f"names shard {shard!r}, which is missing")
            header = read_safetensors_header(shard_path)
            for name in names:
                if name not in header:
                    raise CheckpointError(
                        shard_path, f"tensor {name!r} listed in the index is absent"
                    )
                tensors[name] = header[name]
        return tensors
    for file in sorted(folder.glob("*.safetensors")):
        for name, info in read_safetensors_header(file).items():
            tensors.setdefault(name, info)
    return tensors
