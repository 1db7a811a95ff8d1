"""Generate spectool's compact TensorRT-LLM option tables from the research schema files.

Input: ``tests/fixtures/trtllm-schema/{v1.0,v1.1,v1.2,main-0004396}.json``, the repository's copy
of ``../shared/research/trtllm-schema`` (facts extracted with ``ast`` from four versions of
``tensorrt_llm/llmapi/llm_args.py``; see that folder's README).
Output: ``spectool/trtllm/schema/{0.21,1.0,1.1,1.2,main}.json``, read at run time by
``spectool.trtllm.releases``.

Each output keeps what spectool needs to validate an ``--config`` YAML without TensorRT-LLM
installed: every pydantic config class (fields, annotation strings, defaults, accepted keys,
required flags), the string enums, the top-level class per backend, and how ``speculative_config``
is dispatched on ``decoding_type``.

Three things are not in the research JSON and are written here by hand, each with its source:

* the ``from_dict`` spelling map of the 0.21/1.0/1.1 generations (``DecodingBaseConfig.from_dict``
  in llm_args.py; the JSON records classes, not that dict);
* the discriminated union ``CudaGraphConfigType`` of main (``Field(discriminator="mode")``);
* the whole 0.21 generation, which has no schema file: it is derived from v1.0.json with the
  deltas read in a pre-1.0 llm_args.py (indexed copy id 292162234; its decoding classes match a
  third-party extraction labelled "tensorrt 0.21.0", id 59740160565). Fields of ``BaseLlmArgs`` and
  ``TrtLlmArgs`` are taken from 1.0 unchanged, so 0.21 validation is approximate outside
  ``speculative_config`` and the PyTorch-only fields.

Run from the repository root:  python scripts/extract_trtllm_schema.py [--check]
``--check`` exits 1 when the shipped files differ from what this script generates.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# A copy of ../shared/research/trtllm-schema kept in the repository (the tables' "source" fields
# still name where the extraction was made).
RESEARCH = REPO / "tests" / "fixtures" / "trtllm-schema"
OUT = REPO / "spectool" / "trtllm" / "schema"

SOURCES = {
    "1.0": "v1.0.json",
    "1.1": "v1.1.json",
    "1.2": "v1.2.json",
    "main": "main-0004396.json",
}

# DecodingBaseConfig.from_dict spelling -> class (llm_args.py of each generation).
_FROM_DICT_0_21 = {
    "MTP": "MTPDecodingConfig",
    "Medusa": "MedusaDecodingConfig",
    "Eagle": "EagleDecodingConfig",
    "Lookahead": "LookaheadDecodingConfig",
    "NGram": "NGramDecodingConfig",
    "DraftTarget": "DraftTargetDecodingConfig",
}
_FROM_DICT_1_0 = {
    **_FROM_DICT_0_21,
    "UserProvided": "UserProvidedDecodingConfig",
    "AUTO": "AutoDecodingConfig",
}
FROM_DICT = {
    "0.21": _FROM_DICT_0_21,
    "1.0": _FROM_DICT_1_0,
    "1.1": {**_FROM_DICT_1_0, "SaveState": "SaveHiddenStatesDecodingConfig"},
}

# Spellings the docs use that differ from the discriminator literal. The code that maps them was
# not found in llm_args.py (only a private ``_decoding_type_alias`` "recorded for warnings"), so
# spectool never emits them; the built-in validator accepts them as the documented alias.
DOC_ALIASES = {
    "1.2": {"DraftTarget": "Draft_Target"},
    "main": {"DraftTarget": "Draft_Target"},
}

# TypeAlias unions referenced by annotations (main llm_args.py: CudaGraphConfigType =
# Annotated[Union[DecodeCudaGraphConfig, EncodeCudaGraphConfig], Field(discriminator="mode")]).
UNIONS = {
    "main": {
        "CudaGraphConfigType": {
            "discriminator": "mode",
            "default": "decode",
            "members": {"decode": "DecodeCudaGraphConfig", "encode": "EncodeCudaGraphConfig"},
        }
    }
}


def _field(annotation: str, default: str, keys: list[str] | None = None) -> dict[str, Any]:
    return {
        "annotation": annotation,
        "default": default,
        "required": False,
        "literal_values": None,
        "accepted_keys": keys or [],
    }


# 0.21 generation (pre-1.0 llm_args.py, id 292162234): decoding classes are plain BaseModel
# (extra keys ignored by TensorRT-LLM; spectool still rejects them), Eagle/DraftTarget carry
# ``pytorch_weights_path``, NGram uses ``prompt_lookup_num_tokens``.
_DECODING_0_21: dict[str, dict[str, tuple[str, str]]] = {
    "DecodingBaseConfig": {
        "max_draft_len": ("Optional[int]", "None"),
        "speculative_model": ("Optional[Union[str, Path]]", "None"),
    },
    "MedusaDecodingConfig": {
        "medusa_choices": ("Optional[List[List[int]]]", "None"),
        "num_medusa_heads": ("Optional[int]", "None"),
    },
    "EagleDecodingConfig": {
        "eagle_choices": ("Optional[List[List[int]]]", "None"),
        "greedy_sampling": ("Optional[bool]", "True"),
        "posterior_threshold": ("Optional[float]", "None"),
        "use_dynamic_tree": ("Optional[bool]", "False"),
        "dynamic_tree_max_topK": ("Optional[int]", "None"),
        "num_eagle_layers": ("Optional[int]", "None"),
        "max_non_leaves_per_layer": ("Optional[int]", "None"),
        "pytorch_weights_path": ("Optional[str]", "None"),
        "eagle3_one_model": ("Optional[bool]", "True"),
    },
    "NGramDecodingConfig": {
        "prompt_lookup_num_tokens": ("int", "2"),
        "max_matching_ngram_size": ("int", "4"),
        "is_keep_all": ("bool", "True"),
        "is_use_oldest": ("bool", "True"),
        "is_public_pool": ("bool", "True"),
    },
    "DraftTargetDecodingConfig": {
        "pytorch_weights_path": ("Optional[str]", "None"),
    },
    "MTPDecodingConfig": {
        "num_nextn_predict_layers": ("Optional[int]", "1"),
        "use_relaxed_acceptance_for_thinking": ("Optional[bool]", "False"),
        "relaxed_topk": ("Optional[int]", "1"),
        "relaxed_delta": ("Optional[float]", "0.0"),
    },
}

# TorchLlmArgs own fields in the 0.21 generation (id 292162234), on top of BaseLlmArgs.
_TORCH_OWN_0_21: dict[str, tuple[str, str]] = {
    "build_config": ("Optional[object]", "None"),
    "use_cuda_graph": ("bool", "False"),
    "cuda_graph_batch_sizes": ("Optional[List[int]]", "None"),
    "cuda_graph_max_batch_size": ("int", "0"),
    "cuda_graph_padding_enabled": ("bool", "False"),
    "disable_overlap_scheduler": ("bool", "False"),
    "moe_max_num_tokens": ("Optional[int]", "None"),
    "moe_load_balancer": ("Optional[Union[object, str]]", "None"),
    "attn_backend": ("str", "'TRTLLM'"),
    "moe_backend": ("str", "'CUTLASS'"),
    "mixed_sampler": ("bool", "False"),
    "enable_trtllm_sampler": ("bool", "False"),
    "kv_cache_dtype": ("str", "'auto'"),
    "enable_iter_perf_stats": ("bool", "False"),
    "enable_iter_req_stats": ("bool", "False"),
    "print_iter_log": ("bool", "False"),
    "torch_compile_config": ("Optional[TorchCompileConfig]", "None"),
    "autotuner_enabled": ("bool", "True"),
    "enable_layerwise_nvtx_marker": ("bool", "False"),
    "load_format": ("Union[str, LoadFormat]", "LoadFormat.AUTO"),
    "enable_min_latency": ("bool", "False"),
    "stream_interval": ("int", "1"),
}

_TORCH_COMPILE_0_21: dict[str, tuple[str, str]] = {
    "torch_compile_fullgraph": ("bool", "True"),
    "torch_compile_inductor_enabled": ("bool", "False"),
    "torch_compile_piecewise_cuda_graph": ("bool", "False"),
    "torch_compile_enable_userbuffers": ("bool", "True"),
}


def _class(bases: list[str], extra: str, fields: dict[str, tuple[str, str]]) -> dict[str, Any]:
    return {
        "bases": bases,
        "extra": extra,
        "fields": {name: _field(ann, default, [name]) for name, (ann, default) in fields.items()},
    }


def derive_0_21(v10: dict[str, Any]) -> dict[str, Any]:
    """The 0.21 generation: v1.0 with the pre-1.0 deltas listed above."""
    doc = copy.deepcopy(v10)
    doc["label"] = "0.21 (derived from v1.0.json + pre-1.0 llm_args.py deltas)"
    classes = doc["classes"]
    for name in [c for c in classes if c.endswith("DecodingConfig")]:
        if name not in ("DecodingBaseConfig", "LookaheadDecodingConfig"):
            del classes[name]
    classes.pop("CudaGraphConfig", None)
    base = _DECODING_0_21["DecodingBaseConfig"]
    classes["DecodingBaseConfig"] = _class(["BaseModel"], "ignore", base)
    for name, own in _DECODING_0_21.items():
        if name == "DecodingBaseConfig":
            continue
        classes[name] = _class(["DecodingBaseConfig"], "ignore", {**base, **own})
    lookahead = classes["LookaheadDecodingConfig"]
    lookahead["fields"] = {
        **{n: _field(a, d, [n]) for n, (a, d) in base.items()},
        **{n: f for n, f in lookahead["fields"].items() if n not in ("speculative_model_dir",)},
    }
    classes["TorchCompileConfig"] = _class(["BaseModel"], "forbid", _TORCH_COMPILE_0_21)
    torch_fields = copy.deepcopy(classes["BaseLlmArgs"]["fields"])
    for name, (ann, default) in _TORCH_OWN_0_21.items():
        torch_fields[name] = _field(ann, default, [name])
    classes["TorchLlmArgs"] = {
        "bases": ["BaseLlmArgs"],
        "extra": classes["TorchLlmArgs"]["extra"],
        "fields": torch_fields,
    }
    return doc


def _compact_field(name: str, f: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"type": f["annotation"], "default": f["default"]}
    keys = f.get("accepted_keys") or [name]
    if keys != [name]:
        out["keys"] = keys
    if f.get("required"):
        out["required"] = True
    return out


def _decoding_types(release: str, doc: dict[str, Any]) -> tuple[str, dict[str, str]]:
    if release in FROM_DICT:
        return "from_dict", dict(FROM_DICT[release])
    types: dict[str, str] = {}
    for name, cls in doc["classes"].items():
        field = cls["fields"].get("decoding_type")
        if field and field.get("literal_values"):
            for value in field["literal_values"]:
                types[value] = name
    return "discriminator", types


def compact(release: str, doc: dict[str, Any], source_file: str) -> dict[str, Any]:
    dispatch, types = _decoding_types(release, doc)
    enums = {
        name: {"values": e["values"], "str_enum": e["str_enum"]}
        for name, e in doc["enums"].items()
        if e.get("values_known")
    }
    classes = {
        name: {
            "extra": cls["extra"],
            "fields": {fname: _compact_field(fname, f) for fname, f in cls["fields"].items()},
        }
        for name, cls in doc["classes"].items()
    }
    return {
        "release": release,
        "generated_by": "scripts/extract_trtllm_schema.py",
        "source": f"../shared/research/trtllm-schema/{source_file}",
        "label": doc["label"],
        "top_level": {k: v for k, v in doc["llm_args_classes"].items() if k != "base"},
        "speculative": {
            "field": "speculative_config",
            "dispatch": dispatch,
            "decoding_types": types,
            "doc_aliases": DOC_ALIASES.get(release, {}),
        },
        "unions": UNIONS.get(release, {}),
        "aliases": doc.get("class_aliases", {}),
        "enums": enums,
        "classes": classes,
    }


def generate(research: Path = RESEARCH) -> dict[str, str]:
    """Return ``{file name: JSON text}`` for every release spectool knows."""
    docs = {rel: json.loads((research / f).read_text()) for rel, f in SOURCES.items()}
    out = {rel: compact(rel, doc, SOURCES[rel]) for rel, doc in docs.items()}
    out["0.21"] = compact("0.21", derive_0_21(docs["1.0"]), "v1.0.json (+ 0.21 deltas)")
    return {
        f"{rel}.json": json.dumps(out[rel], indent=1, ensure_ascii=True) + "\n"
        for rel in ("0.21", "1.0", "1.1", "1.2", "main")
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if shipped files differ")
    parser.add_argument("--research", type=Path, default=RESEARCH)
    args = parser.parse_args(argv)
    files = generate(args.research)
    stale = [
        n for n, text in files.items() if not (OUT / n).is_file() or (OUT / n).read_text() != text
    ]
    if args.check:
        for name in stale:
            print(f"stale: spectool/trtllm/schema/{name}")
        return 1 if stale else 0
    from spectool.io import atomic_write_text

    for name, text in files.items():
        atomic_write_text(OUT / name, text)
        (OUT / name).chmod(0o644)  # package data: readable by every user of an installed wheel
        print(f"wrote spectool/trtllm/schema/{name} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
