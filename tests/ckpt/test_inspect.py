"""Classification reads the weights, not the metadata."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from ckpt_factory import fixture_tensors, write_safetensors, write_torch_bin

from spectool.ckpt.inspect import CAUSAL_LM, EAGLE1, EAGLE3, MEDUSA, inspect_folder
from spectool.ckpt.refs import resolve_checkpoint
from spectool.errors import CheckpointError

KINDS = {
    "meta-llama/Llama-3.1-8B-Instruct": (CAUSAL_LM, 0),
    "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": (EAGLE3, 0),
    "yuhuili/EAGLE-LLaMA3-Instruct-8B": (EAGLE1, 0),
    "yuhuili/EAGLE-llama2-chat-7B": (EAGLE1, 0),
    "deepseek-ai/DeepSeek-V3": (CAUSAL_LM, 1),
    "Qwen/Qwen3-0.6B": (CAUSAL_LM, 0),
    "Qwen/Qwen2.5-7B-Instruct": (CAUSAL_LM, 0),
}


@pytest.mark.parametrize("repo", sorted(KINDS))
def test_fixture_kinds(make_ckpt, repo: str) -> None:
    ckpt = inspect_folder(make_ckpt(repo), repo)
    assert (ckpt.kind, ckpt.mtp_layers) == KINDS[repo]


def test_weight_bytes_match_published_index_total(make_ckpt) -> None:
    ckpt = inspect_folder(make_ckpt("meta-llama/Llama-3.1-8B-Instruct"))
    assert ckpt.weight_bytes == 16060522496  # the index's metadata.total_size on the Hub


def _copy_config(repo: str, dest: Path, **changes: object) -> dict:
    from ckpt_factory import fixture_dir

    config = json.loads((fixture_dir(repo) / "config.json").read_text())
    config.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del config[key]
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config))
    return config


def test_eagle3_export_renaming_midlayer_is_still_eagle3(tmp_path: Path) -> None:
    tensors, _ = fixture_tensors("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    renamed = {
        k.replace("midlayer.", "layers.0."): v
        for k, v in tensors.items()
        if k not in ("d2t", "t2d")
    }
    folder = tmp_path / "e3"
    _copy_config("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", folder, draft_vocab_size=None)
    write_safetensors(folder / "model.safetensors", renamed)
    assert inspect_folder(folder).kind == EAGLE3


def test_mtp_only_by_tensors_and_declared_but_stripped(tmp_path: Path) -> None:
    tensors, _ = fixture_tensors("deepseek-ai/DeepSeek-V3")
    folder = tmp_path / "tensor-only"
    _copy_config("deepseek-ai/DeepSeek-V3", folder, num_nextn_predict_layers=None)
    write_safetensors(folder / "model.safetensors", tensors)
    ckpt = inspect_folder(folder)
    assert ckpt.mtp_declared_layers is None and ckpt.mtp_layers == 1
    stripped = {k: v for k, v in tensors.items() if not k.startswith("model.layers.61.")}
    folder2 = tmp_path / "stripped"
    _copy_config("deepseek-ai/DeepSeek-V3", folder2)
    write_safetensors(folder2 / "model.safetensors", stripped)
    ckpt2 = inspect_folder(folder2)
    assert ckpt2.mtp_declared_layers == 1 and ckpt2.mtp_layers == 0


def test_medusa_heads(tmp_path: Path) -> None:
    folder = tmp_path / "medusa"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "medusa_num_heads": 2,
                "hidden_size": 64,
                "base_model_name_or_path": "lmsys/vicuna-7b-v1.3",
            }
        )
    )
    tensors = {}
    for h in range(2):
        tensors[f"{h}.0.linear.weight"] = ("F16", [64, 64])
        tensors[f"{h}.0.linear.bias"] = ("F16", [64])
        tensors[f"{h}.1.weight"] = ("F16", [100, 64])
    write_torch_bin(folder / "medusa_lm_head.pt", tensors)
    ckpt = inspect_folder(folder)
    assert ckpt.kind == MEDUSA and ckpt.medusa_heads == 2


def test_bad_folders(tmp_path: Path, make_ckpt) -> None:
    with pytest.raises(CheckpointError, match="no config.json"):
        inspect_folder(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match="malformed JSON"):
        inspect_folder(tmp_path)
    (tmp_path / "config.json").write_text('"a string"')
    with pytest.raises(CheckpointError, match="expected a JSON object"):
        inspect_folder(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no weights"):
        inspect_folder(tmp_path)
    cfgdir = tmp_path / "cfgdir"
    (cfgdir / "config.json").mkdir(parents=True)
    with pytest.raises(CheckpointError):
        inspect_folder(cfgdir)
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    with pytest.raises(CheckpointError, match="cannot resolve"):
        resolve_checkpoint(str(loop))
    with pytest.raises(CheckpointError, match="no such folder"):
        resolve_checkpoint(str(tmp_path / "missing"))
    src = make_ckpt("Qwen/Qwen3-0.6B")
    link = tmp_path / "link"
    os.symlink(src, link)
    assert resolve_checkpoint(str(link)).kind == CAUSAL_LM
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    with open(copy / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        resolve_checkpoint(str(copy))
