"""A finding: one checked fact about a target/drafter pair, with a stable code.

The codes are a contract (documented in the README): scripts match on them, so a code is never
renamed or reused for another meaning.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass(frozen=True)
class Finding:
    """One result of a rule: ``code`` (stable), severity, a message naming both sides' values,
    and a hint saying how to fix it."""

    code: str
    severity: Severity
    message: str
    hint: str = ""

    def to_json(self) -> dict[str, str]:
        d = asdict(self)
        d["severity"] = self.severity.value
        return d


def error(code: str, message: str, hint: str = "") -> Finding:
    return Finding(code, Severity.ERROR, message, hint)


def warning(code: str, message: str, hint: str = "") -> Finding:
    return Finding(code, Severity.WARNING, message, hint)


def info(code: str, message: str, hint: str = "") -> Finding:
    return Finding(code, Severity.INFO, message, hint)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Errors first, then warnings, then infos; stable within a severity."""
    return sorted(findings, key=lambda f: _ORDER[f.severity])
