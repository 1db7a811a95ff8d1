"""Models shipped inside spectool (``spectool:NAME``): their folders, one assembled on first use.

``demo-target-mtp`` is ``demo-target`` plus one multi-token-prediction module in DeepSeek-V3's
layout (config.json ``num_nextn_predict_layers: 1``; the module stored as decoder layer
``num_hidden_layers``: ``enorm``, ``hnorm``, ``eh_proj``, a decoder layer, ``shared_head.norm``
and ``shared_head.head``, plus an ``embed_tokens`` copy; deepseek-ai/DeepSeek-V3
``README_WEIGHTS.md``). Shipping that folder would repeat demo-target's 20 MB of weights, and
its decoder layer alone (1.7 MB in float16) is more than the room left under the 25 MB cap on
shipped models (``tests/test_demo_models.py``). So ``assets/models/demo-target-mtp/`` holds its
config.json, its model card and ``mtp.safetensors``: the module's own tensors, and its decoder
layer as rank-r updates ``B @ A`` of demo-target's last layer, from which
``scripts/train_mtp.py`` trained it. The first use writes the real checkpoint, a sharded folder
``check``, the engine and the server read like any other (``model-00001-of-00002`` is
demo-target's weights, ``model-00002-of-00002`` the MTP module with every tensor in full, and
``model.safetensors.index.json``), under ``$SPECTOOL_CACHE/models/`` (default
``~/.cache/spectool``), keyed by the shipped files' hash, written to a temporary folder and
renamed, so concurrent first uses are safe.

Pure numpy and safetensors (no torch): ``check`` resolves ``spectool:demo-target-mtp`` too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from spectool.errors import CheckpointError

BUILTIN_PREFIX = "spectool:"
PACKED_FILE = "mtp.safetensors"  # the shipped form of an MTP module (see the docstring)
TARGET_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
)
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
INDEX_FILE = "model.safetensors.index.json"
LORA_A, LORA_B = ".lora_A", ".lora_B"
_DTYPE_BYTES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "BOOL": 1}


def assets_dir() -> Path:
    return Path(str(resources.files("spectool") / "assets" / "models"))


def builtin_path(name: str) -> Path:
    """The checkpoint folder of ``spectool:NAME`` (assembled into the cache when shipped
    packed); :class:`CheckpointError` for an unknown name."""
    folder = assets_dir() / name
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{BUILTIN_PREFIX}{name}", "no such built-in model")
    if (folder / PACKED_FILE).is_file():
        return assembled(folder)
    return folder


def _cache_root() -> Path:
    from spectool.ckpt.hub import cache_dir

    return cache_dir() / "models"


def assembled(packed: Path) -> Path:
    """The full checkpoint of the packed model in ``packed`` (written once, then reused)."""
    config = json.loads((packed / "config.json").read_text(encoding="utf-8"))
    base = assets_dir() / _metadata(packed).get("base_model", "")
    if not (base / "model.safetensors").is_file():
        raise CheckpointError(packed / PACKED_FILE, "names no shipped base model")
    digest = hashlib.sha256()
    for path in (packed / "config.json", packed / PACKED_FILE):
        digest.update(path.read_bytes())
    digest.update(str((base / "model.safetensors").stat().st_size).encode())
    dest = _cache_root() / f"{packed.name}-{digest.hexdigest()[:16]}"
    if (dest / INDEX_FILE).is_file():
        return dest
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    except OSError as exc:
        raise CheckpointError(dest.parent, _unwritable(exc)) from None
    try:
        _write_checkpoint(packed, base, config, tmp)
        os.replace(tmp, dest)  # atomic; fails if another process got there first
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (dest / INDEX_FILE).is_file():
            raise CheckpointError(dest, _unwritable(exc)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _unwritable(exc: OSError) -> str:
    return (
        f"cannot write the assembled checkpoint ({exc.strerror or exc}); set SPECTOOL_CACHE "
        "to a writable folder"
    )


def _metadata(packed: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(packed / PACKED_FILE), framework="np") as f:
        return dict(f.metadata() or {})


def unpack_module(packed: Path, base: Path, num_layers: int) -> dict[str, object]:
    """Every tensor of the MTP module in full (numpy float16, DeepSeek-V3 names): low-rank
    updates merged into the base layer (in float64, rounded once), the embedding and LM-head
    copies taken from ``base``."""
    import numpy as np
    from safetensors.numpy import load_file

    try:
        base_layer = int(_metadata(packed)["base_layer"])
    except (KeyError, ValueError):
        raise CheckpointError(packed / PACKED_FILE, "metadata lacks base_layer") from None
    stored = load_file(str(packed / PACKED_FILE))
    main = load_file(str(base / "model.safetensors"))
    prefix, base_prefix = f"model.layers.{num_layers}.", f"model.layers.{base_layer}."
    out: dict[str, object] = {}
    for name, array in stored.items():
        if name.endswith(LORA_A):
            continue
        if not name.startswith(prefix):
            raise CheckpointError(packed / PACKED_FILE, f"tensor {name} is not under {prefix}")
        if name.endswith(LORA_B):
            stem = name[: -len(LORA_B)]
            a = stored[stem + LORA_A].astype(np.float64)  # [r, in]
            weight = main[base_prefix + stem[len(prefix) :] + ".weight"].astype(np.float64)
            out[stem + ".weight"] = (weight + array.astype(np.float64) @ a).astype(np.float16)
        else:
            out[name] = array
    embed = main["model.embed_tokens.weight"]
    out[prefix + "embed_tokens.weight"] = embed.copy()
    out[prefix + "shared_head.head.weight"] = main.get("lm_head.weight", embed).copy()
    return out


def _write_checkpoint(packed: Path, base: Path, config: dict, dest: Path) -> None:
    from safetensors import safe_open
    from safetensors.numpy import save_file

    module = unpack_module(packed, base, int(config["num_hidden_layers"]))
    shutil.copyfile(base / "model.safetensors", dest / SHARDS[0])
    save_file(module, str(dest / SHARDS[1]), metadata={"format": "pt"})  # type: ignore[arg-type]
    weight_map: dict[str, str] = {}
    total = 0
    for shard in SHARDS:
        with safe_open(str(dest / shard), framework="np") as f:
            for key in f.keys():  # noqa: SIM118
                weight_map[key] = shard
                info = f.get_slice(key)
                count = 1
                for dim in info.get_shape():
                    count *= dim
                total += count * _DTYPE_BYTES[info.get_dtype()]
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (dest / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    for name in TARGET_FILES:
        if (base / name).is_file():
            shutil.copyfile(base / name, dest / name)
    shutil.copyfile(packed / "config.json", dest / "config.json")
