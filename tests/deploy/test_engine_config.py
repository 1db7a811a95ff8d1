"""The embedded engine's build files: checked without torch, the same way EngineConfig checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spectool.deploy.engine_config import read_engine_config, validate_engine_config
from spectool.errors import BadInputError, ConfigError

CASES = [
    {"method": "draft_model", "max_draft_len": 3, "max_batch_size": 8, "max_seq_len": 512},
    {"method": "none", "max_batch_size": 8, "max_seq_len": 512},
    {"method": "ngram", "max_draft_len": 2, "max_concurrency": 4, "max_batch_size": 8},
    {"method": "draft_model", "max_draft_len": 4, "draft_len_schedule": {4: 4, 8: 2}},
    {"method": "eagle9"},
    {"method": "draft_model", "max_draft_len": 0},
    {"method": "none", "max_draft_len": -1},
    {"method": "ngram", "max_draft_len": 2, "max_concurrency": 0},
    {"method": "ngram", "max_draft_len": 2, "max_concurrency": 4, "draft_len_schedule": {1: 2}},
    {"method": "draft_model", "max_draft_len": 4, "draft_len_schedule": {}},
    {"method": "draft_model", "max_draft_len": 4, "draft_len_schedule": {0: 4}},
    {"method": "draft_model", "max_draft_len": 4, "draft_len_schedule": {1: 5}},
    {"method": "draft_model", "max_draft_len": 4, "draft_len_schedule": {2: 3, 8: 1}},
    {"method": "none", "max_batch_size": 0},
    {"method": "none", "max_seq_len": 1},
]


def _accepts(check, fields) -> bool:
    try:
        check(fields)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("fields", CASES, ids=lambda f: json.dumps(f, sort_keys=True))
def test_same_verdict_as_the_engine(fields: dict) -> None:
    from spectool.engine.engine import EngineConfig

    assert _accepts(validate_engine_config, fields) == _accepts(lambda f: EngineConfig(**f), fields)


def test_read_names_the_file_and_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "speculative.json"
    path.write_text(json.dumps({"method": "ngram", "max_batch_size": 4, "max_seq_len": 64,
                                "draft_len_schedule": {"4": 2, "8": 1}, "max_draft_len": 2}))  # fmt: skip
    assert read_engine_config(path)["draft_len_schedule"] == {4: 2, 8: 1}
    path.write_text(json.dumps({"method": "ngram", "max_batch_size": 4, "max_seq_len": 64,
                                "device": "cuda"}))  # fmt: skip
    with pytest.raises(BadInputError, match="unknown keys device") as exc:
        read_engine_config(path)
    assert exc.value.where == str(path)
    path.write_text(json.dumps({"method": "ngram", "max_draft_len": 0, "max_batch_size": 4,
                                "max_seq_len": 64}))  # fmt: skip
    with pytest.raises(BadInputError, match="max_draft_len must be >= 1"):
        read_engine_config(path)
    path.write_text(json.dumps({"method": "ngram", "max_draft_len": 2, "max_batch_size": 4,
                                "max_seq_len": 64, "draft_len_schedule": {"x": 2}}))  # fmt: skip
    with pytest.raises(BadInputError, match="must map batch sizes to integers"):
        read_engine_config(path)
    path.write_text("{")
    with pytest.raises(BadInputError, match="malformed JSON"):
        read_engine_config(path)


# Any import of torch (or of the engine package) fails, as on a machine without torch.
_NO_TORCH = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith(("torch.", "spectool.engine")):
            raise ImportError(f"blocked import of {name}")
        return None
sys.meta_path.insert(0, _Block())
from spectool.cli.app import main
code = main(sys.argv[1:])
assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules), "torch imported"
sys.exit(code)
"""


def test_torch_build_runs_without_torch(tmp_path: Path) -> None:
    out = tmp_path / "b"
    result = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, "build", "--engine", "torch", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    spec = json.loads((out / "speculative.json").read_text())
    assert spec["method"] == "draft_model" and spec["max_draft_len"] == 4  # the demo profile
    assert read_engine_config(out / "baseline.json")["method"] == "none"
