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


def _readme_setup_commands() -> list[str]:
    section = (ROOT / "README.md").read_text().split("## Set up", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_ci_runs_the_readmes_test_command_in_a_fresh_clone() -> None:
    """.ci/run holds the README's test command verbatim and runs it in a clone of HEAD made in a
    new temporary folder, so nothing beside the checkout (../shared) can be read."""
    commands = _readme_setup_commands()
    assert len(commands) == 2 and "pytest" in commands[1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci
    assert "set -euo pipefail" in ci
    assert "export HF_HUB_OFFLINE=1" in ci
    clone = next(i for i, line in enumerate(ci) if line.startswith("git clone"))
    enter = next(i for i, line in enumerate(ci) if line.startswith("cd ") and "$work" in line)
    assert ci[clone].split()[-1].startswith('"$work/') and 'mktemp -d "${TMPDIR' in "\n".join(ci)
    assert clone < enter < ci.index(commands[1])
    assert "ruff check spectool tests benchmarks scripts" in ci[ci.index(commands[1]) :]


def test_nothing_outside_the_repository_is_read() -> None:
    """No test, benchmark or script reads ../shared (a fresh clone has none)."""
    outside = re.compile(r"""["']\.\./shared|/\s*["']shared["']""")
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in ("tests", "benchmarks", "scripts", "spectool")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if outside.search(line) and '"source":' not in line  # provenance labels, not reads
    ]
    assert offenders == []
