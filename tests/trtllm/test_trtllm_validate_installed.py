"""validate_options' installed-package path.

TensorRT-LLM cannot be installed here (multi-GB CUDA wheels, no GPU), so these tests put a small
stand-in ``tensorrt_llm`` on ``sys.path``: a ``*.dist-info`` with a version (found by
``importlib.metadata``) and an ``llmapi/llm_args.py`` built the way the real ones are (pydantic,
``extra="forbid"``, ``AliasChoices``, a discriminated union in 1.2, ``from_dict`` in 1.0). They
check spectool's adapter (key aliases, dispatch, error paths), not TensorRT-LLM itself.
"""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from spectool.errors import ConfigError
from spectool.trtllm.releases import detect_installed_version
from spectool.trtllm.validate import validate_options

_COMMON = """
from typing import Annotated, Literal, Optional, Union
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, NonNegativeInt


class StrictBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KvCacheConfig(StrictBaseModel):
    free_gpu_memory_fraction: Optional[float] = 0.9
"""

_LLM_ARGS_1_2 = (
    _COMMON
    + """

class DecodingBaseConfig(StrictBaseModel):
    max_draft_len: Optional[NonNegativeInt] = None
    speculative_model: Optional[str] = Field(
        default=None, validation_alias=AliasChoices("speculative_model", "speculative_model_dir"))


class Eagle3DecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Eagle3"] = "Eagle3"


class NGramDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["NGram"] = "NGram"


SpeculativeConfig = Annotated[
    Union[Eagle3DecodingConfig, NGramDecodingConfig], Field(discriminator="decoding_type")]


class TorchLlmArgs(StrictBaseModel):
    model: str
    speculative_config: Optional[SpeculativeConfig] = None
    kv_cache_config: KvCacheConfig = Field(default_factory=KvCacheConfig)
    enable_iter_perf_stats: bool = False
"""
)

_LLM_ARGS_1_0 = (
    _COMMON
    + """

class DecodingBaseConfig(StrictBaseModel):
    max_draft_len: Optional[int] = None
    speculative_model_dir: Optional[str] = None

    @classmethod
    def from_dict(cls, data: dict):
        classes = {"Eagle": EagleDecodingConfig}
        config_class = classes.get(data.get("decoding_type"))
        if config_class is None:
            raise ValueError(f"Invalid decoding type: {data.get('decoding_type')}")
        data.pop("decoding_type")
        return config_class(**data)


class EagleDecodingConfig(DecodingBaseConfig):
    pass


class TorchLlmArgs(StrictBaseModel):
    model: str
    speculative_config: Optional[object] = None
    enable_iter_perf_stats: bool = False
"""
)


@pytest.fixture
def installed(tmp_path, monkeypatch):
    def install(version: str, llm_args: str) -> None:
        pkg = tmp_path / "tensorrt_llm"
        (pkg / "llmapi").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "llmapi" / "__init__.py").write_text("")
        (pkg / "llmapi" / "llm_args.py").write_text(textwrap.dedent(llm_args))
        dist = tmp_path / f"tensorrt_llm-{version}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {version}\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        importlib.invalidate_caches()

    yield install
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]


def test_installed_1_2_classes_validate(installed):
    installed("1.2.0", _LLM_ARGS_1_2)
    assert detect_installed_version() == "1.2.0"
    spec = {"decoding_type": "Eagle3", "max_draft_len": 4, "speculative_model_dir": "/d"}
    validate_options({"speculative_config": spec, "enable_iter_perf_stats": True}, "1.2", "pytorch")
    # max_batch_size is in spectool's 1.2 table but not in the installed stand-in: proves the
    # installed classes decided, and the message says so.
    with pytest.raises(ConfigError, match="installed TensorRT-LLM 1.2.0") as info:
        validate_options({"max_batch_size": 8}, "1.2", "pytorch")
    assert info.value.where == "max_batch_size"
    with pytest.raises(ConfigError) as info:
        validate_options({"speculative_config": dict(spec, max_draft_len=-1)}, "1.2", "pytorch")
    assert info.value.where == "speculative_config.Eagle3.max_draft_len"
    with pytest.raises(ConfigError) as info:
        validate_options({"kv_cache_config": {"free_gpu_memory_fraction": "x"}}, "1.2", "pytorch")
    assert info.value.where == "kv_cache_config.free_gpu_memory_fraction"


def test_installed_other_generation_falls_back_to_builtin(installed):
    installed("1.2.0", _LLM_ARGS_1_2)
    validate_options({"max_batch_size": 8}, "main", "pytorch")  # built-in main table accepts it
    with pytest.raises(ConfigError, match="TensorRT-LLM main"):
        validate_options({"max_batch_sizes": 8}, "main", "pytorch")


def test_installed_1_0_uses_from_dict(installed):
    installed("1.0.0", _LLM_ARGS_1_0)
    spec = {"decoding_type": "Eagle", "max_draft_len": 4, "speculative_model_dir": "/d"}
    validate_options({"speculative_config": spec}, "1.0", "pytorch")
    with pytest.raises(ConfigError, match="Invalid decoding type: Eagle3") as info:
        validate_options(
            {"speculative_config": dict(spec, decoding_type="Eagle3")}, "1.0", "pytorch"
        )
    assert info.value.where == "speculative_config"
    with pytest.raises(ConfigError) as info:
        validate_options({"speculative_config": dict(spec, typo=1)}, "1.0", "pytorch")
    assert info.value.where == "speculative_config.typo"
