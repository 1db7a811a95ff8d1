"""A checkpoint folder -> :class:`Checkpoint`: its config, tensor table and kind, no tensor data.

The kind is read from the weights, because the metadata lies: the official EAGLE-3 head for
Llama-3.1 declares plain ``LlamaForCausalLM``, newer EAGLE-3 exports rename ``midlayer.`` to
``layers.0.``, and MTP layers are declared by ``num_nextn_predict_layers``, by
``mtp_num_hidden_layers``, or only by their tensors.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from spectool.ckpt.header import read_safetensors_folder
from spectool.ckpt.jsonfile import read_json_object
from spectool.ckpt.tensors import DTYPE_NAMES, TensorInfo
from spectool.ckpt.tokenizer import TokenizerFacts, load_tokenizer_facts
from spectool.ckpt.torch_bin import read_torch_bin
from spectool.errors import CheckpointError

# Checkpoint kinds.
CAUSAL_LM = "causal_lm"
EAGLE1 = "eagle1"  # EAGLE-1 and EAGLE-2 share one weight format
EAGLE3 = "eagle3"
MEDUSA = "medusa"
UNKNOWN = "unknown"

KIND_LABELS = {
    CAUSAL_LM: "standalone causal LM",
    EAGLE1: "EAGLE-1/2 head",
    EAGLE3: "EAGLE-3 head",
    MEDUSA: "Medusa heads",
    UNKNOWN: "unrecognised weights",
}

# Integer config fields the checks read: (smallest allowed, largest allowed). The largest is far
# beyond any real model (x10 or more), so only broken or hostile configs hit it.
_CONFIG_INTS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "target_hidden_size"), (1, 1 << 20)),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers"), (1, 100_000)),
    **dict.fromkeys(("vocab_size", "draft_vocab_size"), (1, 1 << 26)),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_key_value_heads"), (1, 1 << 16)),
    "head_dim": (1, 1 << 16),
    "kv_lora_rank": (1, 1 << 20),
    **dict.fromkeys(("max_position_embeddings", "max_seq_len", "n_positions"), (1, 1 << 34)),
    **dict.fromkeys(
        ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers"), (0, 1000)
    ),
}
# What each kind's config must give for the verdict: (field, its aliases).
_REQUIRED = {
    "hidden size": ("hidden_size", "d_model", "n_embd"),
    "layer count": ("num_hidden_layers", "n_layer", "num_layers"),
    "vocabulary size": ("vocab_size",),
}

_BIN_NAMES = ("pytorch_model.bin", "medusa_lm_head.pt", "model.pt", "pytorch_model.pt")
_LAYER_RE = re.compile(r"^(?:model\.)?layers\.(\d+)\.")
_MEDUSA_RE = re.compile(r"^(?:medusa_head\.)?(\d+)\.(\d+)\.(?:linear\.)?weight$")


def read_tensors(folder: Path) -> dict[str, TensorInfo]:
    """Every tensor of a checkpoint folder, from safetensors headers or a restricted torch reader."""
    tensors = read_safetensors_folder(folder)
    if tensors:
        return tensors
    bin_index = folder / "pytorch_model.bin.index.json"
    if bin_index.is_file():
        weight_map = read_json_object(bin_index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(bin_index, "weight_map is missing or not an object")
        for shard in sorted(set(map(str, weight_map.values()))):
            if Path(shard).name != shard or not (folder / shard).is_file():
                raise CheckpointError(bin_index, f"names shard {shard!r}, which is missing")
            tensors.update(read_torch_bin(folder / shard))
        return tensors
    for name in _BIN_NAMES:
        if (folder / name).is_file():
            return read_torch_bin(folder / name)
    for path in sorted(folder.glob("*.bin")) + sorted(folder.glob("*.pt")):
        tensors.update(read_torch_bin(path))
    return tensors


def _strip(name: str) -> str:
    return name[len("model.") :] if name.startswith("model.") else name


@dataclass(frozen=True)
class Checkpoint:
    """Facts about one checkpoint. ``ref`` is what the user typed, ``path`` where it was read."""

    ref: str
    path: Path
    config: dict[str, Any] = field(repr=False)
    tensors: dict[str, TensorInfo] = field(repr=False)
    revision: str | None = None

    # -- config facts --------------------------------------------------------------------
    @cached_property
    def text_config(self) -> dict[str, Any]:
        """The language-model part of the config (multimodal configs nest it)."""
        nested = self.config.get("text_config")
        return {**self.config, **nested} if isinstance(nested, dict) else self.config

    def _int(self, *keys: str) -> int | None:
        for key in keys:
            value = self.text_config.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    @property
    def architecture(self) -> str | None:
        archs = self.config.get("architectures")
        return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None

    @property
    def model_type(self) -> str | None:
        value = self.config.get("model_type")
        return value if isinstance(value, str) else None

    @property
    def hidden_size(self) -> int | None:
        return self._int("hidden_size", "d_model", "n_embd")

    @property
    def num_layers(self) -> int | None:
        return self._int("num_hidden_layers", "n_layer", "num_layers")

    @property
    def vocab_size(self) -> int | None:
        return self._int("vocab_size")

    @property
    def num_attention_heads(self) -> int | None:
        return self._int("num_attention_heads", "n_head")

    @property
    def num_kv_heads(self) -> int | None:
        return self._int("num_key_value_heads") or self.num_attention_heads

    @property
    def head_dim(self) -> int | None:
        explicit = self._int("head_dim")
        if explicit:
            return explicit
        h, n = self.hidden_size, self.num_attention_heads
        return h // n if h and n else None

    @property
    def max_position_embeddings(self) -> int | None:
        return self._int("max_position_embeddings", "max_seq_len", "n_positions")

    @property
    def kv_lora_rank(self) -> int | None:
        """Set for multi-head latent attention (DeepSeek-V2/V3): the KV cache holds one latent."""
        return self._int("kv_lora_rank")

    @property
    def config_dtype(self) -> str | None:
        value = self.config.get("torch_dtype") or self.config.get("dtype")
        return value if isinstance(value, str) else None

    @cached_property
    def weight_dtype(self) -> str | None:
        """The dtype holding most parameters, in torch's spelling (``bfloat16``)."""
        counts: Counter[str] = Counter()
        for t in self.tensors.values():
            counts[t.dtype] += t.numel
        if not counts:
            return None
        top = counts.most_common(1)[0][0]
        return DTYPE_NAMES.get(top, top.lower())

    @property
    def dtype(self) -> str | None:
        return self.config_dtype or self.weight_dtype

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @cached_property
    def num_parameters(self) -> int:
        return sum(t.numel for t in self.tensors.values())

    @property
    def base_model(self) -> str | None:
        """The base model a head says it was trained for, when its config names one."""
        for key in ("base_model_name_or_path", "base_model"):
            value = self.config.get(key)
            if isinstance(value, str) and value:
                return value
        return None

    # -- tensor facts --------------------------------------------------------------------
    @cached_property
    def _names(self) -> dict[str, TensorInfo]:
        return {_strip(n): t for n, t in self.tensors.items()}

    def tensor(self, *names: str) -> TensorInfo | None:
        for name in names:
            if name in self._names:
                return self._names[name]
        return None

    @property
    def embed_rows(self) -> int | None:
        t = self.tensor("embed_tokens.weight", "tok_embeddings.weight", "wte.weight")
        return t.shape[0] if t and t.shape else None

    @property
    def lm_head_rows(self) -> int | None:
        t = self.tensor("lm_head.weight")
        return t.shape[0] if t and t.shape else None

    @property
    def fc(self) -> TensorInfo | None:
        """The EAGLE fusion layer ``fc`` ([hidden, k x hidden]) of an EAGLE head."""
        return self.tensor("fc.weight")

    @property
    def layer_ids(self) -> set[int]:
        ids = set()
        for name in self.tensors:
            m = _LAYER_RE.match(name)
            if m:
                ids.add(int(m.group(1)))
        return ids

    @property
    def draft_vocab_size(self) -> int | None:
        return self._int("draft_vocab_size")

    @property
    def target_hidden_size(self) -> int | None:
        return self._int("target_hidden_size")

    @property
    def eagle_capture_layers(self) -> list[int] | None:
        """Target layers whose hidden states an EAGLE-3 head fuses, when the config names them."""
        eagle_config = self.config.get("eagle_config")
        if isinstance(eagle_config, dict):
            ids = eagle_config.get("eagle_aux_hidden_state_layer_ids")
            if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
                return ids
        return None

    @cached_property
    def mtp_tensor_layers(self) -> int:
        """How many MTP layers the weights hold (DeepSeek: layers >= num_hidden_layers with an
        ``eh_proj``; Qwen3-Next/Qwen3.5: ``mtp.layers.N``; MiMo: ``model.mtp_layers.N``)."""
        n_main = self.num_layers or 0
        ids: set[str] = set()
        for name in self.tensors:
            m = _LAYER_RE.match(name)
            if m and int(m.group(1)) >= n_main and ("eh_proj" in name or "enorm" in name):
                ids.add(f"l{m.group(1)}")
                continue
            m2 = re.match(r"^(?:model\.)?(?:mtp\.layers|mtp_layers|mtp)\.(\d+)\.", name)
            if m2:
                ids.add(f"m{m2.group(1)}")
        return len(ids)

    @property
    def mtp_declared_layers(self) -> int | None:
        return self._int("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")

    @property
    def mtp_layers(self) -> int:
        """Native MTP layers the target really has: declared and present in the weights."""
        declared = self.mtp_declared_layers
        present = self.mtp_tensor_layers
        if declared is not None:
            return min(declared, present) if present else 0
        return present

    @cached_property
    def medusa_heads(self) -> int:
        heads = set()
        for name in self.tensors:
            m = _MEDUSA_RE.match(name)
            if m:
                heads.add(int(m.group(1)))
        return len(heads)

    # -- classification ------------------------------------------------------------------
    @cached_property
    def kind(self) -> str:
        names = self._names
        if self.medusa_heads or any(n.startswith("medusa_head.") for n in names):
            return MEDUSA
        fc = self.fc
        if fc is not None and len(fc.shape) == 2 and fc.shape[0] > 0:
            hidden_out, fused_in = fc.shape
            if any(n.startswith("midlayer.") for n in names) or "d2t" in names:
                return EAGLE3
            if any(n.endswith("hidden_norm.weight") for n in names):
                return EAGLE3
            q = self.tensor("layers.0.self_attn.q_proj.weight", "midlayer.self_attn.q_proj.weight")
            if q is not None and len(q.shape) == 2 and q.shape[1] == 2 * hidden_out:
                return EAGLE3  # EAGLE-3's first layer attends over [embeds, fused hidden]
            if fused_in == 2 * hidden_out:
                return EAGLE1
            if fused_in % hidden_out == 0 and fused_in // hidden_out >= 3:
                return EAGLE3
            return UNKNOWN
        has_embed = self.embed_rows is not None
        has_layers = bool(self.layer_ids)
        if has_embed and has_layers:
            return CAUSAL_LM
        return UNKNOWN

    @property
    def is_standalone_lm(self) -> bool:
        return self.kind == CAUSAL_LM

    # -- tokenizer -----------------------------------------------------------------------
    @cached_property
    def tokenizer(self) -> TokenizerFacts | None:
        return load_tokenizer_facts(self.path)

    @cached_property
    def generation_config(self) -> dict[str, Any]:
        path = self.path / "generation_config.json"
        return read_json_object(path) if path.is_file() else {}

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        for source in (self.generation_config, self.config):
            value = source.get("eos_token_id")
            if isinstance(value, int) and not isinstance(value, bool):
                return (value,)
            if isinstance(value, list) and all(isinstance(v, int) for v in value):
                return tuple(value)
        return ()

    def summary(self) -> dict[str, Any]:
        """The JSON ``target``/``drafter`` object of ``spectool check --json``."""
        return {
            "ref": self.ref,
            "path": str(self.path),
            "revision": self.revision,
            "kind": self.kind,
            "kind_label": KIND_LABELS[self.kind],
            "architecture": self.architecture,
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "vocab_size": self.vocab_size,
            "num_attention_heads": self.num_attention_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "dtype": self.dtype,
            "num_tensors": len(self.tensors),
            "weight_bytes": self.weight_bytes,
            "mtp_layers": self.mtp_layers,
            "draft_vocab_size": self.draft_vocab_size,
            "tokenizer_size": self.tokenizer.size if self.tokenizer else None,
        }


def inspect_folder(
    folder: Path,
    ref: str | None = None,
    *,
    tensors: dict[str, TensorInfo] | None = None,
    revision: str | None = None,
) -> Checkpoint:
    """Read a checkpoint folder (config.json + weights, or ``tensors`` given from elsewhere)."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(folder, "no config.json: not a Hugging Face checkpoint folder")
    config = read_json_object(config_path)
    if tensors is None:
        tensors = read_tensors(folder)
    if not tensors:
        raise CheckpointError(
            folder, "no weights found (*.safetensors, pytorch_model.bin or medusa_lm_head.pt)"
        )
    ckpt = Checkpoint(
        ref=ref or str(folder), path=folder, config=config, tensors=tensors, revision=revision
    )
    validate_config(ckpt, config_path)
    return ckpt


def validate_config(ckpt: Checkpoint, config_path: Path) -> None:
    """Refuse a config whose numbers no model can have, or that lacks what the verdict needs.

    Every integer field the checks read must be a whole number in a plausible range (NaN, 0,
    negative, strings and absurd sizes are refused); a causal LM must give its hidden size, layer
    count and vocabulary size, an EAGLE head its hidden size and vocabulary size (Medusa heads
    are read from their tensors). Raises a one-line :class:`CheckpointError` naming the field.
    """
    fields = ckpt.text_config
    for key, (low, high) in _CONFIG_INTS.items():
        value = fields.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise CheckpointError(config_path, f"{key} is {value!r}, not a whole number")
        if not low <= value <= high:
            raise CheckpointError(
                config_path, f"{key} is {value}, outside the possible range {low}..{high}"
            )
    if ckpt.kind == CAUSAL_LM:
        required = ("hidden size", "layer count", "vocabulary size")
    elif ckpt.kind in (EAGLE1, EAGLE3):
        required = ("hidden size", "vocabulary size")
    else:
        return
    for what in required:
        keys = _REQUIRED[what]
        if all(fields.get(k) is None for k in keys):
            raise CheckpointError(
                config_path,
                f"no {' / '.join(keys)}: the {what} of this {KIND_LABELS[ckpt.kind]} is needed "
                "for the check",
            )
