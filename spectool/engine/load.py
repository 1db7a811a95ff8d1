"""Load a Hugging Face checkpoint folder (config.json + safetensors) into a :class:`Transformer`.

Reads ``model.safetensors`` or a sharded ``model.safetensors.index.json`` with ``safe_open`` and
maps Hugging Face tensor names onto the engine's (gpt-fast style) names, fusing q/k/v into one
projection and gate/up into another, and storing projection matrices ``[in, out]`` (see
:class:`~spectool.engine.model.Projection`). No pickle, no remote code: anything unexpected is a
:class:`CheckpointError`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from spectool.ckpt.jsonfile import read_json_object
from spectool.engine.model import ModelArgs, Transformer
from spectool.errors import CheckpointError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Tensors some exporters leave behind that carry nothing the model needs.
IGNORED_SUFFIXES: tuple[str, ...] = ("rotary_emb.inv_freq",)

# Engine weights stored [in, out] (see model.Projection): transposed from Hugging Face's [out, in].
PROJECTION_WEIGHTS: tuple[str, ...] = (
    "attention.wqkv.weight",
    "attention.wo.weight",
    "feed_forward.w13.weight",
    "feed_forward.w2.weight",
    "output.weight",
)

# DeepSeek-V3's MTP modules (config.json ``num_nextn_predict_layers``) are stored as decoder
# layers num_hidden_layers, num_hidden_layers + 1, ...: not part of the target's forward (they
# draft: spectool.engine.mtp_module), so the target's loader passes over them, as transformers'
# DeepseekV3 models do (``_keys_to_ignore_on_load_unexpected = [r"model\.layers\.61.*"]``).
MTP_CONFIG_KEY = "num_nextn_predict_layers"
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def read_json(path: Path) -> dict[str, Any]:
    """Parse a JSON object from a checkpoint folder, size-capped; errors name the file."""
    return read_json_object(path)


def read_model_args(folder: Path) -> ModelArgs:
    """:class:`ModelArgs` of the checkpoint in ``folder`` (its config.json)."""
    if not folder.is_dir():
        raise CheckpointError(folder, "not a folder")
    config_path = folder / "config.json"
    return ModelArgs.from_hf_config(read_json(config_path), where=config_path)


def declared_mtp_layers(folder: Path) -> int:
    """``num_nextn_predict_layers`` of ``folder/config.json`` (0 when absent)."""
    path = folder / "config.json"
    value = read_json(path).get(MTP_CONFIG_KEY) or 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointError(path, f"{MTP_CONFIG_KEY} is {value!r}, not a count")
    return value


def is_mtp_tensor(name: str, n_layers: int, n_mtp: int) -> bool:
    """Whether ``name`` belongs to one of ``n_mtp`` MTP modules stored after ``n_layers``."""
    m = _LAYER_RE.match(name)
    return m is not None and n_layers <= int(m.group(1)) < n_layers + n_mtp


def resolve_dtype(name: str) -> torch.dtype:
    """torch dtype for a config name (``float32``, ``float64``, ``bfloat16``, ``float16``)."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _weight_files(folder: Path) -> dict[str, Path]:
    """HF tensor name -> the safetensors file that holds it."""
    index_path = folder / INDEX_FILE
    single = folder / SINGLE_FILE
    if index_path.is_file():
        weight_map = read_json(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(index_path, "has no 'weight_map' object")
        files: dict[str, Path] = {}
        root = folder.resolve()
        for name, file_name in weight_map.items():
            file_path = (folder / str(file_name)).resolve()
            if file_path.parent != root:
                raise CheckpointError(index_path, f"shard {file_name!r} is outside the folder")
            files[str(name)] = file_path
        return files
    if single.is_file():
        try:
            with safe_open(str(single), framework="pt", device="cpu") as f:
                return dict.fromkeys(f.keys(), single)
        except (SafetensorError, OSError) as e:
            raise CheckpointError(single, f"not a readable safetensors file: {e}") from e
    raise CheckpointError(folder, f"has neither {SINGLE_FILE} nor {INDEX_FILE}")


def _read_tensors(files: dict[str, Path]) -> Iterator[tuple[str, Tensor]]:
    by_file: dict[Path, list[str]] = {}
    for name, path in files.items():
        by_file.setdefault(path, []).append(name)
    for path, names in by_file.items():
        if not path.is_file():
            raise CheckpointError(path, "shard named in the index is missing")
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                present = set(f.keys())
                for name in names:
                    if name not in present:
                        raise CheckpointError(path, f"lacks tensor {name!r} named in the index")
                    yield name, f.get_tensor(name)
        except (SafetensorError, OSError) as e:
            raise CheckpointError(path, f"not a readable safetensors file: {e}") from e


def read_checkpoint_tensors(folder: Path, wanted: Callable[[str], bool]) -> dict[str, Tensor]:
    """The tensors of ``folder`` whose Hugging Face name ``wanted`` accepts (file dtype)."""
    files = {name: path for name, path in _weight_files(folder).items() if wanted(name)}
    return dict(_read_tensors(files))


def hf_to_engine_names(args: ModelArgs) -> dict[str, str]:
    """Engine parameter name for every Hugging Face tensor name (q/k/v map to one fused name,
    gate/up to another)."""
    names = {
        "model.embed_tokens.weight": "tok_embeddings.weight",
        "model.norm.weight": "norm.weight",
    }
    if not args.tie_word_embeddings:
        names["lm_head.weight"] = "output.weight"
    for i in range(args.n_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        names[hf + "input_layernorm.weight"] = ours + "attention_norm.weight"
        names[hf + "post_attention_layernorm.weight"] = ours + "ffn_norm.weight"
        kinds = ["weight", "bias"] if args.qkv_bias else ["weight"]
        for proj in ("q_proj", "k_proj", "v_proj"):
            for kind in kinds:
                names[f"{hf}self_attn.{proj}.{kind}"] = f"{ours}attention.wqkv.{kind}"
        for kind in ["weight", "bias"] if args.o_bias else ["weight"]:
            names[f"{hf}self_attn.o_proj.{kind}"] = f"{ours}attention.wo.{kind}"
        if args.qk_norm:
            names[hf + "self_attn.q_norm.weight"] = ours + "attention.q_norm.weight"
            names[hf + "self_attn.k_norm.weight"] = ours + "attention.k_norm.weight"
        for hf_proj, our_proj in (("gate_proj", "w13"), ("up_proj", "w13"), ("down_proj", "w2")):
            for kind in ["weight", "bias"] if args.mlp_bias else ["weight"]:
                names[f"{hf}mlp.{hf_proj}.{kind}"] = f"{ours}feed_forward.{our_proj}.{kind}"
    return names


def _concat_rows(folder: Path, names: list[str], raw: dict[str, Tensor]) -> Tensor:
    """Stack the output rows of projections that share an input (q/k/v, gate/up)."""
    tensors = [raw[name] for name in names]
    if len({t.shape[1:] for t in tensors}) > 1:
        shapes = ", ".join(f"{n} {tuple(t.shape)}" for n, t in zip(names, tensors, strict=True))
        raise CheckpointError(folder, f"projections of one input disagree in shape: {shapes}")
    return torch.cat(tensors)


def load_state_dict(folder: Path, args: ModelArgs) -> dict[str, Tensor]:
    """Read every tensor the model needs, renamed to engine names, q/k/v and gate/up fused,
    projection weights transposed to ``[in, out]`` (in file dtype)."""
    mapping = hf_to_engine_names(args)
    n_mtp = declared_mtp_layers(folder)
    files = {
        name: path
        for name, path in _weight_files(folder).items()
        if not (n_mtp and is_mtp_tensor(name, args.n_layers, n_mtp))
    }
    raw: dict[str, Tensor] = {}
    unexpected: list[str] = []
    wanted = {name: path for name, path in files.items() if name in mapping}
    for name in files:
        if name not in mapping and not name.endswith(IGNORED_SUFFIXES):
            # A tied checkpoint may still carry lm_head.weight: it must equal the embeddings.
            if not (name == "lm_head.weight" and args.tie_word_embeddings):
                unexpected.append(name)
    if unexpected:
        shown = ", ".join(sorted(unexpected)[:3])
        raise CheckpointError(
            folder, f"{len(unexpected)} tensors the {args.model_type} model lacks, e.g. {shown}"
        )
    missing = sorted(set(mapping) - set(wanted))
    if missing:
        shown = ", ".join(missing[:3])
        raise CheckpointError(folder, f"{len(missing)} tensors missing, e.g. {shown}")
    for name, tensor in _read_tensors(wanted):
        raw[name] = tensor
    state: dict[str, Tensor] = {}
    for hf_name, ours in mapping.items():
        if ".wqkv." in ours or ".w13." in ours:
            continue
        state[ours] = raw[hf_name]
        if ours.endswith(PROJECTION_WEIGHTS):
            state[ours] = state[ours].t()
    for i in range(args.n_layers):
        prefix = f"model.layers.{i}.self_attn."
        for kind in ["weight", "bias"] if args.qkv_bias else ["weight"]:
            names = [f"{prefix}{p}.{kind}" for p in ("q_proj", "k_proj", "v_proj")]
            fused = _concat_rows(folder, names, raw)
            state[f"layers.{i}.attention.wqkv.{kind}"] = fused.t() if kind == "weight" else fused
        prefix = f"model.layers.{i}.mlp."
        for kind in ["weight", "bias"] if args.mlp_bias else ["weight"]:
            names = [f"{prefix}{p}.{kind}" for p in ("gate_proj", "up_proj")]
            fused = _concat_rows(folder, names, raw)
            state[f"layers.{i}.feed_forward.w13.{kind}"] = fused.t() if kind == "weight" else fused
    return state


def load_model(
    folder: Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    max_seq_len: int = 2048,
    pack_fp16: bool = True,
) -> Transformer:
    """Build a :class:`Transformer` from a Hugging Face folder, in eval mode, rope tables set up.

    ``max_seq_len`` (tokens) bounds the positions the model will be asked about; it is capped at
    the checkpoint's ``max_position_embeddings``. ``pack_fp16``: projections whose float32
    weights float16 holds exactly use fbgemm's float16-weight kernel on CPU
    (:meth:`Transformer.pack_fp16_weights`).
    """
    folder = Path(folder)
    args = read_model_args(folder)
    state = load_state_dict(folder, args)
    with torch.device("meta"):
        model = Transformer(args)
    expected = model.state_dict()
    for name, tensor in state.items():
        if name not in expected:
            raise CheckpointError(folder, f"tensor {name!r} has no place in the model")
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(
                folder,
                f"tensor {name!r} has shape {tuple(tensor.shape)}, "
                f"config.json implies {tuple(expected[name].shape)}",
            )
    state = {name: t.to(device=device, dtype=dtype).contiguous() for name, t in state.items()}
    if args.tie_word_embeddings:  # one matrix: the LM head's [dim, V], embeddings a view of it
        state["output.weight"] = state["tok_embeddings.weight"].t().contiguous()
        state["tok_embeddings.weight"] = state["output.weight"].t()
    model.load_state_dict(state, strict=True, assign=True)
    if args.tie_word_embeddings:
        model.tie_embeddings()
    if pack_fp16:
        model.pack_fp16_weights()
    model.setup_rope(min(max_seq_len, args.max_position_embeddings))
    if pack_fp16:  # the same float16-exact weights, all layers in one C call where it fits
        model.enable_native()
    return model.eval()
