"""A finding: one checked fact about a target/drafter pair, with a stable code.

The codes are a contract (documented in the README): scripts match on them, so a code is never
renamed or reused for another meaning.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass(frozen=True)
class Finding:
    """One result of a rule: ``code`` (stable), severity, a message naming both sides' values,
    and a hint saying how to fix it. ``file``: the file the evidence was read from (None when
    the finding is about the request, not a file); ``evidence``: the values it rests on."""

    code: str
    severity: Severity
    message: str
    hint: str = ""
    file: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict, hash=False)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = self.severity.value
        return d


def error(
    code: str,
    message: str,
    hint: str = "",
    *,
    file: str | None = None,
    evidence: dict[str, Any] | None = None,
) -> Finding:
    return Finding(code, Severity.ERROR, message, hint, file, evidence or {})


def warning(
    code: str,
    message: str,
    hint: str = "",
    *,
    file: str | None = None,
    evidence: dict[str, Any] | None = None,
) -> Finding:
    return Finding(code, Severity.WARNING, message, hint, file, evidence or {})


def info(
    code: str,
    message: str,
    hint: str = "",
    *,
    file: str | None = None,
    evidence: dict[str, Any] | None = None,
) -> Finding:
    return Finding(code, Severity.INFO, message, hint, file, evidence or {})


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Errors first, then warnings, then infos; stable within a severity."""
    return sorted(findings, key=lambda f: _ORDER[f.severity])
