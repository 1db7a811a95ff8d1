"""Environment variables read once, and named limits."""

from __future__ import annotations

import os


def _is_true(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


DEBUG: bool = _is_true(os.environ.get("SPECTOOL_DEBUG"))

# Safetensors headers of real checkpoints are a few MB at most (DeepSeek-V3 shards: < 200 KB).
MAX_SAFETENSORS_HEADER_BYTES: int = 100 * 1024 * 1024
# Refuse to parse JSON metadata files (config.json, index, tokenizer_config) beyond this size.
MAX_JSON_BYTES: int = 64 * 1024 * 1024
# Nesting of JSON metadata: real configs and tokenizers nest fewer than 10 levels.
MAX_JSON_DEPTH: int = 64
# tokenizer.json of large vocabularies (Qwen3: 11 MB, Gemma: 33 MB).
MAX_TOKENIZER_BYTES: int = 256 * 1024 * 1024
