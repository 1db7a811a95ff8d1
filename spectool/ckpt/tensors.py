"""What a checkpoint's weights are, without their data: names, dtypes, shapes."""

from __future__ import annotations

import math
from dataclasses import dataclass

# Bytes per element for every dtype name seen in safetensors headers and torch pickles.
# Sub-byte types (F4, I4 packed by quantizers) are stored in U8/I32 containers, so they never
# appear here; F8 variants are one byte.
DTYPE_BYTES: dict[str, float] = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "F8_E4M3FNUZ": 1,
    "F8_E5M2FNUZ": 1,
    "F4": 0.5,
    "F6_E2M3": 0.75,
    "F6_E3M2": 0.75,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "C64": 8,
}

# Human names used in messages and config.json's torch_dtype.
DTYPE_NAMES: dict[str, str] = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its file describes it: ``dtype`` uses safetensors' names (``BF16``)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str = ""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return int(self.numel * DTYPE_BYTES.get(self.dtype, 0))
