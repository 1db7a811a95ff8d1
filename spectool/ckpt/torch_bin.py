"""Tensor names, dtypes and shapes of ``pytorch_model.bin`` / ``medusa_lm_head.pt`` files,
read through a restricted unpickler that never executes code from the file.

A torch zip checkpoint holds ``<prefix>/data.pkl`` (the pickled state dict) and one raw entry
per storage under ``<prefix>/data/``. The pickle only ever needs a handful of globals (the tensor
rebuild functions, storage and dtype names, ``OrderedDict``): each is mapped to a harmless local
stand-in that records the shape, and every other global is refused. torch is never imported.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from spectool.ckpt.tensors import TensorInfo
from spectool.constants import MAX_JSON_BYTES
from spectool.errors import CheckpointError

_STORAGE_DTYPES = {
    "HalfStorage": "F16",
    "FloatStorage": "F32",
    "DoubleStorage": "F64",
    "BFloat16Storage": "BF16",
    "LongStorage": "I64",
    "IntStorage": "I32",
    "ShortStorage": "I16",
    "CharStorage": "I8",
    "ByteStorage": "U8",
    "BoolStorage": "BOOL",
    "Float8_e4m3fnStorage": "F8_E4M3",
    "Float8_e5m2Storage": "F8_E5M2",
    "UntypedStorage": "U8",
}
_TORCH_DTYPES = {
    "float16": "F16",
    "half": "F16",
    "float32": "F32",
    "float": "F32",
    "float64": "F64",
    "double": "F64",
    "bfloat16": "BF16",
    "int64": "I64",
    "long": "I64",
    "int32": "I32",
    "int": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}


@dataclass(frozen=True)
class _Dtype:
    name: str


@dataclass(frozen=True)
class _StorageType:
    dtype: str


@dataclass(frozen=True)
class _Storage:
    dtype: str
    key: str


@dataclass(frozen=True)
class _Tensor:
    dtype: str
    shape: tuple[int, ...]


def _shape(size: Any) -> tuple[int, ...]:
    if not isinstance(size, tuple | list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in size
    ):
        raise pickle.UnpicklingError(f"tensor size {size!r} is not a tuple of sizes")
    return tuple(size)


def _rebuild_tensor(storage: Any, _offset: Any, size: Any, *_rest: Any) -> _Tensor:
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError("tensor without a storage")
    return _Tensor(storage.dtype, _shape(size))


def _rebuild_meta(dtype: Any, size: Any, *_rest: Any) -> _Tensor:
    if not isinstance(dtype, _Dtype):
        raise pickle.UnpicklingError("meta tensor without a dtype")
    return _Tensor(dtype.name, _shape(size))


def _rebuild_parameter(data: Any, *_rest: Any) -> Any:
    return data


_REBUILDERS = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_meta_tensor_no_storage"): _rebuild_meta,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("collections", "OrderedDict"): OrderedDict,
    ("torch", "Size"): tuple,
}


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the globals a state dict needs, to local stand-ins; refuses the rest."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _REBUILDERS:
            return _REBUILDERS[(module, name)]
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(_STORAGE_DTYPES[name])
        if module == "torch" and name in _TORCH_DTYPES:
            return _Dtype(_TORCH_DTYPES[name])
        raise pickle.UnpicklingError(f"refusing global {module}.{name}")

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        storage_type, key = pid[1], pid[2]
        if isinstance(storage_type, _Dtype):  # newer torch: ('storage', UntypedStorage, ...)
            storage_type = _StorageType(storage_type.name)
        if not isinstance(storage_type, _StorageType):
            raise pickle.UnpicklingError(f"unexpected storage type {storage_type!r}")
        return _Storage(storage_type.dtype, str(key))


def read_torch_bin(path: str | Path, fileobj: BinaryIO | None = None) -> dict[str, TensorInfo]:
    """Tensor name -> :class:`TensorInfo` of a torch zip checkpoint, never executing its code.

    ``fileobj`` (seekable) replaces reading ``path`` from disk: a remote file opened with range
    requests then costs only the zip directory and ``data.pkl``, never the tensor data.
    """
    path = Path(path)
    source: Any = fileobj if fileobj is not None else path
    try:
        if not zipfile.is_zipfile(source):
            raise CheckpointError(
                path,
                "not a torch zip checkpoint (legacy pre-1.6 format or not torch at all); "
                "convert it to safetensors",
            )
        with zipfile.ZipFile(source) as zf:
            pkl = [i for i in zf.infolist() if i.filename.endswith("data.pkl")]
            if len(pkl) != 1:
                raise CheckpointError(
                    path, f"expected one data.pkl in the archive, found {len(pkl)}"
                )
            if pkl[0].file_size > MAX_JSON_BYTES:
                raise CheckpointError(path, f"data.pkl is {pkl[0].file_size} bytes, over the limit")
            prefix = pkl[0].filename[: -len("data.pkl")]
            raw = zf.read(pkl[0])
            names = set(zf.namelist())
    except OSError as exc:
        raise CheckpointError(path, f"cannot read: {exc.strerror or exc}") from None
    except (zipfile.BadZipFile, EOFError, ValueError) as exc:
        raise CheckpointError(path, f"corrupt zip archive ({exc})") from None
    try:
        obj = _RestrictedUnpickler(io.BytesIO(raw)).load()
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of a hostile pickle is bad input
        raise CheckpointError(path, f"unsafe or corrupt pickle: {exc}") from None
    if not isinstance(obj, dict):
        raise CheckpointError(path, f"pickle holds {type(obj).__name__}, not a state dict")
    tensors: dict[str, TensorInfo] = {}
    _collect(obj, "", tensors, path)
    if tensors and not any(n.startswith(prefix + "data/") for n in names):
        raise CheckpointError(path, "archive has tensors but no data entries (truncated?)")
    return tensors


def _collect(obj: dict[Any, Any], prefix: str, out: dict[str, TensorInfo], path: Path) -> None:
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, _Tensor):
            out[name] = TensorInfo(name=name, dtype=value.dtype, shape=value.shape, file=path.name)
        elif isinstance(value, dict):  # nested state dicts ({"state_dict": {...}})
            _collect(value, f"{name}.", out, path)
