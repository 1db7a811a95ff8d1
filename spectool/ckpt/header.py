"""Safetensors headers (single file or sharded index) read without touching tensor data.

The format: 8 bytes little-endian header length N, N bytes of JSON mapping each tensor name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the end of the header)
plus an optional ``__metadata__`` string map. Everything is validated against the file size
before it is trusted: a hostile header cannot make us allocate more than the cap, and a truncated
file is named as such.
"""

from __future__ import annotations

import json
import math
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
    file = Path(str(where)).name  # once per header: a large one holds ~10^5 tensors
    for name, entry in header.items():
        if name == "__metadata__":
            if entry is not None and not isinstance(entry, dict):
                raise CheckpointError(where, "safetensors __metadata__ is not an object")
            continue
        tensors[name] = _tensor_entry(name, entry, where, data_size, file)
    return tensors


def _size(value: object) -> bool:
    """A JSON integer >= 0 (``json`` gives exact ints; a bool is no size)."""
    return type(value) is int and value >= 0


def _tensor_entry(
    name: str, entry: object, where: str | Path, data_size: int | None, file: str
) -> TensorInfo:
    if not isinstance(entry, dict):
        raise CheckpointError(where, f"tensor {name!r}: entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise CheckpointError(where, f"tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(map(_size, shape)):
        raise CheckpointError(where, f"tensor {name!r}: shape {shape!r} is not a list of sizes")
    info = TensorInfo(name=name, dtype=dtype, shape=tuple(shape), file=file)
    if offsets is not None:
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise CheckpointError(where, f"tensor {name!r}: bad data_offsets {offsets!r}")
        nbytes = int(math.prod(shape) * DTYPE_BYTES[dtype])  # info.nbytes, computed once
        if offsets[1] - offsets[0] != nbytes:
            raise CheckpointError(
                where,
                f"tensor {name!r}: data_offsets span {offsets[1] - offsets[0]} bytes but "
                f"{dtype} x {list(shape)} needs {nbytes}",
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


# Large folders read in this process, keyed by every file in them as it is on disk (a file
# changed, added or removed is another key): a process that reads a ~10^5-tensor model again
# (tests, a build per release) parses its headers once. Small folders are always read.
_FOLDER_CACHE: dict[tuple[object, ...], dict[str, TensorInfo]] = {}
_FOLDER_CACHE_SIZE = 4
_FOLDER_CACHE_MIN_TENSORS = 5000


def _folder_key(folder: Path) -> tuple[object, ...] | None:
    """Every file of ``folder`` as (name, inode, size, mtime_ns, ctime_ns); None if
    unreadable."""
    try:
        entries = []
        with os.scandir(folder) as it:
            for entry in it:
                st = entry.stat()
                entries.append((entry.name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        return (str(folder.resolve()), *sorted(entries))
    except OSError:
        return None


def read_safetensors_folder(folder: Path) -> dict[str, TensorInfo]:
    """All tensors of a folder: through ``model.safetensors.index.json`` when present (every
    listed tensor must be in the shard the index names), else every ``*.safetensors`` file.

    A large folder whose files are unchanged since this process last read it is not parsed
    again (a new dict of the same immutable :class:`TensorInfo` entries is returned)."""
    key = _folder_key(folder)
    cached = _FOLDER_CACHE.get(key) if key is not None else None
    if cached is not None:
        return dict(cached)
    tensors = _read_folder(folder)
    if key is not None and len(tensors) >= _FOLDER_CACHE_MIN_TENSORS:
        while len(_FOLDER_CACHE) >= _FOLDER_CACHE_SIZE:
            del _FOLDER_CACHE[next(iter(_FOLDER_CACHE))]  # the oldest
        _FOLDER_CACHE[key] = dict(tensors)
    return tensors


def _read_folder(folder: Path) -> dict[str, TensorInfo]:
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
            shards.setdefault(shard, []).append(name)
        for shard in shards:  # in the index's order: the first bad name is the one named
            if Path(shard).name != shard:
                raise CheckpointError(index_path, f"shard name {shard!r} is not a plain file name")
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
