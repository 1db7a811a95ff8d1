"""The finding codes are a contract: every code the source can emit is documented in the README."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def emitted_codes() -> set[str]:
    codes: set[str] = set()
    for path in (ROOT / "spectool").rglob("*.py"):
        text = path.read_text()
        codes |= set(re.findall(r'\b(?:error|warning|info)\(\s*"([A-Z][A-Z0-9_]+)"', text))
        codes |= set(re.findall(r'^[A-Z_]+ = "([A-Z][A-Z0-9_]{4,})"$', text, flags=re.M))
    return codes


def test_every_emitted_code_is_documented() -> None:
    readme = (ROOT / "README.md").read_text()
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]{4,})`", readme))
    codes = emitted_codes()
    assert len(codes) >= 30
    assert codes - documented == set()
