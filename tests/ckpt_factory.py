"""Turn tests/fixtures/ckpt/<repo> metadata into real checkpoint folders for tests.

Each folder gets the real config.json, weight files whose headers hold exactly the listed
tensors (safetensors: exact headers, data region left sparse by truncating the file to its full
size, so no disk is used; pytorch_model.bin: a real torch zip whose tensors are stride-0 views of
one element, so the pickle records the full shapes), and the real tokenizer where the family
matches (Llama-3 for Llama-3.x, Qwen3 for Qwen3, Qwen3 minus its last four added tokens for
Qwen2.5).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import math
import os
import re
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CKPT_FIXTURES = FIXTURES / "ckpt"
TOKENIZER_SOURCES = FIXTURES / "tokenizers"  # tokenizer.json stored gzipped (20 MB -> 4 MB)
TRTLLM_SCHEMA_FIXTURES = FIXTURES / "trtllm-schema"

_ST_DTYPES = {
    "bfloat16": "BF16",
    "float16": "F16",
    "float32": "F32",
    "int64": "I64",
    "bool": "BOOL",
}
_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "BOOL": 1, "F8_E4M3": 1}


@functools.cache
def tokenizers_dir() -> Path:
    """The real tokenizers, unpacked once into a temporary folder named by their content.

    Returns a folder with ``llama3/`` and ``qwen3/``, each holding ``tokenizer.json`` and
    ``tokenizer_config.json`` as the libraries expect them. Unpacking writes to a private folder
    first and renames it into place, so concurrent test runs never see half a file.
    """
    sources = sorted(TOKENIZER_SOURCES.glob("*/*"))
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.relative_to(TOKENIZER_SOURCES).as_posix().encode())
        digest.update(path.read_bytes())
    dest = Path(tempfile.gettempdir()) / f"spectool-test-tokenizers-{digest.hexdigest()[:16]}"
    if dest.is_dir():
        return dest
    work = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    for path in sources:
        out = work / path.relative_to(TOKENIZER_SOURCES)
        out.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as src, open(out.with_suffix(""), "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            shutil.copyfile(path, out)
    try:
        os.rename(work, dest)
    except OSError:  # another run put it there first
        shutil.rmtree(work, ignore_errors=True)
    return dest


def fixture_dir(repo_id: str) -> Path:
    return CKPT_FIXTURES / repo_id.replace("/", "__")


def _expand_layers(spec: dict[str, Any], config: dict[str, Any]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    prefix = spec["prefix"]
    lo, hi = spec["i_range"]
    for group, keys in spec.items():
        if not isinstance(keys, dict):
            continue
        m = re.search(r"layers_(\d+)_to_(\d+)", group)
        g_lo, g_hi = (int(m.group(1)), int(m.group(2))) if m else (lo, hi)
        for i in range(max(lo, g_lo), min(hi, g_hi) + 1):
            for key, shape in keys.items():
                name = key.split(" ")[0]
                if "{e}" in name:
                    for e in range(config.get("n_routed_experts", 0)):
                        out[prefix.format(i=i) + name.format(e=e)] = shape
                else:
                    out[prefix.format(i=i) + name] = shape
    return out


def fixture_tensors(repo_id: str) -> tuple[dict[str, tuple[str, list[int]]], dict[str, Any]]:
    """name -> (safetensors dtype, shape) for a fixture, and its weights.json."""
    folder = fixture_dir(repo_id)
    meta = json.loads((folder / "weights.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    default = meta.get("dtype", "bfloat16")
    fp8 = default.startswith("float8")
    base = "BF16" if fp8 else _ST_DTYPES[default.split()[0]]
    shapes: dict[str, Any] = {}
    for key, value in meta.get("keys", {}).items():
        shapes[key.split(" ")[0]] = value
    shapes.update(meta.get("global_keys", {}))
    if "per_layer_keys" in meta:
        shapes.update(_expand_layers(meta["per_layer_keys"], config))
    if "mtp_keys" in meta:
        mtp_layer = config["num_hidden_layers"]
        for key, value in meta["mtp_keys"]["keys"].items():
            if isinstance(value, list):
                shapes[key] = value
        # The MTP layer also holds a full decoder layer shaped like the last main layer.
        last = f"model.layers.{mtp_layer - 1}."
        for name, shape in list(shapes.items()):
            if name.startswith(last):
                shapes[f"model.layers.{mtp_layer}." + name[len(last) :]] = shape
    tensors: dict[str, tuple[str, list[int]]] = {}
    for name, value in shapes.items():
        if isinstance(value, dict):
            tensors[name] = (_ST_DTYPES[value["dtype"]], list(value["shape"]))
            continue
        shape = list(value)
        if fp8 and len(shape) == 2 and ".layers." in name and "proj" in name:
            tensors[name] = ("F8_E4M3", shape)
            scale = [math.ceil(shape[0] / 128), math.ceil(shape[1] / 128)]
            tensors[name + "_scale_inv"] = ("F32", scale)
        else:
            tensors[name] = (base, shape)
    return tensors, meta


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A real safetensors file with exact offsets; the data region is a sparse hole."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = math.prod(shape) * _BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(8 + len(raw) + offset)


def write_torch_bin(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A real torch zip checkpoint whose tensors are stride-0 views of one stored element."""
    import torch

    dtypes = {
        "F16": torch.float16,
        "BF16": torch.bfloat16,
        "F32": torch.float32,
        "I64": torch.int64,
        "BOOL": torch.bool,
    }
    state = {n: torch.zeros(1, dtype=dtypes[d]).expand(*s) for n, (d, s) in tensors.items()}
    torch.save(state, path)


def _tokenizer_family(repo_id: str) -> tuple[str, int] | None:
    """(tokenizer folder, number of entries to keep) for a fixture's family."""
    name = repo_id.lower()
    if "llama-3" in name:
        return "llama3", 128256  # text-only Llama 3.x: drop <|image|> (id 128256)
    if "qwen3" in name:
        return "qwen3", 151669
    if "qwen2.5" in name:
        return "qwen3", 151665  # Qwen2.5 = Qwen3 without its last four added tokens
    return None


def write_tokenizer(folder: Path, family: str, keep: int) -> None:
    src = tokenizers_dir() / family
    tok = json.loads((src / "tokenizer.json").read_text())
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["id"] < keep]
    vocab = tok["model"]["vocab"]
    if isinstance(vocab, dict):
        tok["model"]["vocab"] = {k: v for k, v in vocab.items() if v < keep}
    (folder / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    config = json.loads((src / "tokenizer_config.json").read_text())
    decoder = config.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        config["added_tokens_decoder"] = {k: v for k, v in decoder.items() if int(k) < keep}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))


def build_checkpoint(repo_id: str, dest: Path, *, tokenizer: bool = True) -> Path:
    """Write the fixture ``repo_id`` as a checkpoint folder under ``dest``; return it."""
    src = fixture_dir(repo_id)
    folder = dest / repo_id.replace("/", "__")
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tensors, meta = fixture_tensors(repo_id)
    fmt = meta["checkpoint_format"]
    files = meta["weight_files"]
    if fmt.startswith("pytorch_bin"):
        write_torch_bin(folder / files[0], tensors)
    else:
        if len(files) == 1 and "..." in files[0]:  # "model-00001-of-000163 ... model-00163-of-..."
            last = re.findall(r"model-(\d+)-of-(\d+)", files[0])[-1]
            width, count = len(last[1]), int(last[1])
            files = [
                f"model-{i:0{width}d}-of-{count:0{width}d}.safetensors" for i in range(1, count + 1)
            ]
        names = list(tensors)
        per = math.ceil(len(names) / len(files))
        weight_map: dict[str, str] = {}
        for j, file in enumerate(files):
            chunk = names[j * per : (j + 1) * per]
            write_safetensors(folder / file, {n: tensors[n] for n in chunk})
            weight_map.update({n: file for n in chunk})
        if len(files) > 1 or meta.get("index_file"):
            index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
            (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    family = _tokenizer_family(repo_id) if tokenizer else None
    if family:
        write_tokenizer(folder, *family)
    return folder
