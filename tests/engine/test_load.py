"""Loading Hugging Face folders: single file, shards, and the ways a folder can be wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch  # noqa: TID253 (engine tests use torch throughout)
from safetensors.torch import load_file, save_file

from spectool.engine.load import load_model
from spectool.errors import CheckpointError

from .helpers import write_checkpoint


def _logits(folder: Path) -> torch.Tensor:
    model = load_model(folder, max_seq_len=16)
    ids = torch.arange(2, 12)[None]
    with torch.no_grad():
        return model(ids, torch.arange(10)[None])


def test_sharded_checkpoint_loads_like_single_file(tmp_path: Path) -> None:
    single = write_checkpoint(tmp_path / "single", "qwen2", seed=5)
    sharded = write_checkpoint(tmp_path / "sharded", "qwen2", seed=5, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("model-*.safetensors"))) > 1
    assert torch.equal(_logits(single), _logits(sharded))


def test_dtype_and_max_seq_len(target_dir: Path) -> None:
    model = load_model(target_dir, dtype=torch.float64, max_seq_len=10_000)
    assert model.tok_embeddings.weight.dtype == torch.float64
    assert model.max_seq_len == 256  # capped at max_position_embeddings
    with pytest.raises(ValueError, match="beyond max_seq_len"):
        model(torch.tensor([[3]]), torch.tensor([[256]]))


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_missing_tensor(tmp_path: Path, target_dir: Path) -> None:
    folder = _copy(target_dir, tmp_path / "m")
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"1 tensors missing.*layers\.1\.mlp\.up_proj"):
        load_model(folder)


def test_unexpected_tensor(tmp_path: Path, target_dir: Path) -> None:
    folder = _copy(target_dir, tmp_path / "u")
    tensors = load_file(folder / "model.safetensors")
    tensors["fc.weight"] = torch.zeros(2, 2)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="fc.weight"):
        load_model(folder)


def test_shape_mismatch(tmp_path: Path, target_dir: Path) -> None:
    folder = _copy(target_dir, tmp_path / "s")
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 48
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="config.json implies"):
        load_model(folder)


def test_fused_projections_must_agree_in_shape(tmp_path: Path, target_dir: Path) -> None:
    """q/k/v (and gate/up) are stacked into one matrix at load time: a k_proj reading another
    width is refused naming the tensors, before torch.cat could fail or mis-stack them."""
    folder = _copy(target_dir, tmp_path / "f")
    tensors = load_file(folder / "model.safetensors")
    name = "model.layers.0.self_attn.k_proj.weight"
    tensors[name] = tensors[name][:, :-1].contiguous()
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"disagree in shape.*layers\.0\.self_attn\.k_proj"):
        load_model(folder)


def test_unknown_architecture(tmp_path: Path, target_dir: Path) -> None:
    folder = _copy(target_dir, tmp_path / "a")
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "mixtral"
    config["architectures"] = ["MixtralForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="unsupported model_type 'mixtral'"):
        load_model(folder)


def test_bad_files(tmp_path: Path, target_dir: Path) -> None:
    with pytest.raises(CheckpointError, match="not a folder"):
        load_model(tmp_path / "nowhere")
    folder = _copy(target_dir, tmp_path / "b")
    (folder / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="safetensors"):
        load_model(folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="has neither"):
        load_model(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="malformed JSON"):
        load_model(folder)


def test_index_cannot_point_outside_the_folder(tmp_path: Path, target_dir: Path) -> None:
    folder = _copy(target_dir, tmp_path / "i")
    names = load_file(folder / "model.safetensors").keys()
    index = {"weight_map": dict.fromkeys(names, "../elsewhere.safetensors")}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="outside the folder"):
        load_model(folder)
