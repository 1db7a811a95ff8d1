"""TrtllmDriver (tune's TensorRT-LLM servers) against the trtllm-serve double."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import yaml

from spectool.tuning.request import TuneRequest, resolve
from spectool.tuning.trtllm_driver import TrtllmDriver

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
DRAFT = "meta-llama/Llama-3.2-1B-Instruct"


def _json(url: str, data: bytes | None = None) -> object:
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize(("version", "release"), [("1.2.1", "1.2"), ("1.3.0rc24", "main")])
def test_driver_serves_each_k_with_builds_configs(
    version, release, make_ckpt, trtllm_serve, tmp_path, monkeypatch
):
    monkeypatch.setenv("PATH", f"{trtllm_serve.parent}:/usr/bin:/bin")
    monkeypatch.setenv("TRTLLM_DOUBLE_RELEASE", release)
    resolved = resolve(
        TuneRequest(
            target=str(make_ckpt(LLAMA)),
            drafter=str(make_ckpt(DRAFT)),
            method="draft_model",
            max_draft_len=3,
            engine="trtllm",
            trtllm_version=version,
            gpu="h100-sxm",
            concurrencies=(1, 8),
            out=tmp_path / "tune",
        )
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    with TrtllmDriver(resolved, configs_dir=tmp_path / "configs", log_dir=logs) as driver:
        assert driver.executable == str(trtllm_serve)
        assert driver.gate.effective  # draft_model has a drafter object on both releases
        k2 = driver.serve(2)
        assert k2.k == 2 and k2.base_url.startswith("http://127.0.0.1:")
        assert driver.serve(2) is not k2 and driver.starts == 1  # same k: no restart
        spec = yaml.safe_load((tmp_path / "configs" / "k2" / "speculative.yaml").read_text())
        assert spec["speculative_config"]["max_draft_len"] == 2
        assert "max_concurrency" not in spec["speculative_config"]  # tune measures ungated
        assert _json(f"{k2.base_url}/double/draft_len?batch=64") == {"draft_len": 2}
        # measured with KV-cache block reuse off (tune resends its prompts every block); the
        # build's own file, the one deployed, keeps TensorRT-LLM's default
        served = _json(f"{k2.base_url}/double/options")
        assert served["kv_cache_config"]["enable_block_reuse"] is False  # type: ignore[index]
        assert {k: v for k, v in served.items() if k != "kv_cache_config"} == {  # type: ignore[union-attr]
            k: v for k, v in spec.items() if k != "kv_cache_config"
        }
        assert "enable_block_reuse" not in spec.get("kv_cache_config", {})
        _json(f"{k2.base_url}/v1/completions", b"{}")
        assert len(_json(f"{k2.base_url}/metrics")) == 1
        assert _json(f"{k2.base_url}/metrics") == []  # drained on read
        base = driver.serve(0)
        assert driver.starts == 2 and base.base_url != k2.base_url
        assert _json(f"{base.base_url}/double/draft_len?batch=1") == {"draft_len": 0}
        base_options = _json(f"{base.base_url}/double/options")
        assert base_options["kv_cache_config"]["enable_block_reuse"] is False  # type: ignore[index]
        assert "speculative_config" not in base_options  # type: ignore[operator]
        with pytest.raises(urllib.error.URLError):
            _json(f"{k2.base_url}/health")  # the k=2 server was stopped first
    assert (logs / "trtllm-k2.log").is_file() and (logs / "trtllm-k0.log").is_file()
    with pytest.raises(urllib.error.URLError):
        _json(f"{base.base_url}/health")
