"""Print a profile's ``geometry:`` block, computed from sizes that were read, never typed.

Usage::

    python scripts/profile_geometry.py published llama-3.1-8b-instruct eagle3-llama3.1-8b
    python scripts/profile_geometry.py published:fp8 deepseek-r1
    python scripts/profile_geometry.py checkpoint spectool:demo-target spectool:demo-drafter

``published KEY...``: entries of ``tests/data/published/models.yaml`` (HF config fields read
from real configs, each with its source), through
:func:`spectool.predict.published.geometry_from_published` at bf16 (``published:fp8``: at FP8, for checkpoints that ship FP8 weights such as
DeepSeek-V3's). ``checkpoint REF...``:
checkpoint headers (config.json + safetensors table) through
:func:`spectool.predict.geometry_from_checkpoint`. ``tests/test_profile_prediction.py``
recomputes every profile's block this way and compares.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from spectool.predict.geometry import DTYPE_BYTES, Geometry

PUBLISHED = Path(__file__).resolve().parent.parent / "tests" / "data" / "published"


def spec_of(geom: Geometry, dtype: str) -> dict[str, Any]:
    """The GeometrySpec mapping (a profile's ``geometry.target`` / ``.drafter``) of ``geom``."""
    assert DTYPE_BYTES[dtype] == geom.weight_bytes_per_param, (dtype, geom)
    out: dict[str, Any] = {
        "num_layers": geom.num_layers,
        "hidden_size": geom.hidden_size,
        "num_attention_heads": geom.num_attention_heads,
        "head_dim": geom.head_dim,
        "dense_params": round(geom.dense_params),
        "lm_head_params": round(geom.lm_head_params),
        "weight_dtype": dtype,
        "kv_bytes_per_token": round(geom.kv_bytes_per_token),
    }
    if geom.num_kv_heads is not None:
        out["num_kv_heads"] = geom.num_kv_heads
    if geom.kv_latent:
        out["kv_latent"] = True
    if geom.mtp_layers:
        out["mtp_layers"] = geom.mtp_layers
    if geom.embedding_params is not None:
        out["embedding_params"] = round(geom.embedding_params)
    if geom.is_moe:
        out.update(
            expert_params=round(geom.expert_params),
            num_experts=geom.num_experts,
            experts_per_token=geom.experts_per_token,
            moe_layers=geom.moe_layers,
        )
    return out


def published_geometry(key: str, precision: str = "bf16") -> Geometry:
    from spectool.predict.published import geometry_from_published, load_models

    return geometry_from_published(load_models(PUBLISHED)[key], key, precision)


def checkpoint_geometry(ref: str) -> Geometry:
    from spectool.ckpt.refs import resolve_checkpoint
    from spectool.predict import geometry_from_checkpoint

    return geometry_from_checkpoint(resolve_checkpoint(ref))


def main(argv: list[str]) -> int:
    kind, _, precision = argv[0].partition(":") if argv else ("", "", "")
    if len(argv) < 2 or kind not in ("published", "checkpoint") or precision not in ("", "fp8"):
        print(__doc__, file=sys.stderr)
        return 2
    dtype = precision or ("bf16" if kind == "published" else "fp16")  # demo files: float16
    roles = ("target", "drafter")
    block = {
        role: spec_of(
            published_geometry(ref, dtype) if kind == "published" else checkpoint_geometry(ref),
            dtype,
        )
        for role, ref in zip(roles, argv[1:], strict=False)
    }
    print(yaml.safe_dump({"geometry": block}, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
