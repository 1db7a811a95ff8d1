"""Every command's --help as a newcomer reads it (issue 29): flags shown as flags, every default
shown and equal to what the code uses, options in panels, no sentence broken by the source."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from functools import cache

import pytest
import typer
from typer.core import TyperArgument, TyperOption

from spectool.check import DEFAULT_MAX_SEQ_LEN, DEFAULT_TRTLLM_RELEASE, CheckRequest
from spectool.cli.app import app
from spectool.cli.help import MAIN, PANELS
from spectool.cli.serve import READY_TIMEOUT_S
from spectool.cli.serve_torch import (
    TORCH_DEFAULT_MAX_BATCH_SIZE,
    TORCH_DEFAULT_MAX_DRAFT_LEN,
    TORCH_DEFAULT_MAX_SEQ_LEN,
)
from spectool.deploy.build_request import BuildRequest
from spectool.predicted import DEFAULT_CONCURRENCY
from spectool.tuning.pairing import DEFAULT_BUDGET_S
from spectool.tuning.request import ENGINE_DEFAULTS, TuneRequest

COMMANDS = ("check", "build", "serve", "tune")
BOX = "│╭╮╰╯─"


@cache
def _help(command: str | None, columns: int) -> str:
    argv = [command, "--help"] if command else ["--help"]
    out = subprocess.run(
        [sys.executable, "-m", "spectool.cli.app", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": str(columns), "LINES": "50", "NO_COLOR": "1"},
        check=True,
        timeout=120,
    )
    return out.stdout


def _command(name: str):  # noqa: ANN202 - a click command
    return typer.main.get_command(app).commands[name]


def _shown_default(command, param) -> str | None:  # noqa: ANN001
    """What help shows after ``default:``, as the code defines it; None when nothing."""
    lazy = type(command).help_defaults
    shown = (lazy() if lazy else {}).get(param.name, param.show_default)
    if isinstance(shown, str):
        return f"({shown})"
    return None if param.default is None else str(param.default)


def _is_flag(param) -> bool:  # noqa: ANN001
    return isinstance(param, TyperOption) and param.is_flag


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_boolean_flags_take_no_value(command: str | None) -> None:
    text = _help(command, 80)
    assert "<bool>" not in text
    flags = [p for p in (_command(command).params if command else []) if _is_flag(p)]
    for name in [*(p.opts[0] for p in flags), "--help"]:
        line = next(line for line in text.splitlines() if f"│ {name} " in line)
        after = line.split(name, 1)[1].strip()
        assert not after.startswith("<"), line


@pytest.mark.parametrize("command", COMMANDS)
def test_every_default_is_shown_and_is_the_codes(command: str) -> None:
    cmd = _command(command)
    wide = " ".join(_help(command, 1000).split())
    for param in cmd.params:
        if _is_flag(param) or param.name == "ctx":
            continue
        shown = _shown_default(cmd, param)
        assert shown is not None, f"{command} {param.name}: no default shown"
        assert f"[default: {shown}]" in wide, (command, param.name, shown)
    # prose defaults ("(default ...)") would drift from the code: only [default: ...] says one
    assert not re.search(r"\(default\b|\bDefault:", wide), command


def test_computed_defaults_come_from_the_constants_the_code_uses() -> None:
    def shown(command: str, name: str) -> str:
        cmd = _command(command)
        return _shown_default(cmd, next(p for p in cmd.params if p.name == name))

    for engine, defaults in ENGINE_DEFAULTS.items():
        assert f"{engine}: {','.join(map(str, defaults.concurrencies))}" in shown(
            "tune", "concurrency"
        )
        assert f"{engine}: {defaults.num_prompts}" in shown("tune", "num_prompts")
        assert f"{engine}: {defaults.max_tokens}" in shown("tune", "max_tokens")
        assert f"{engine}: {defaults.ready_timeout_s:g}" in shown("tune", "ready_timeout")
    assert ",".join(map(str, DEFAULT_CONCURRENCY)) in shown("check", "concurrency")
    for command in ("check", "build", "tune"):
        assert DEFAULT_TRTLLM_RELEASE in shown(command, "trtllm_version")
        assert f"at most {DEFAULT_MAX_SEQ_LEN}" in shown(command, "max_seq_len")
    assert str(TORCH_DEFAULT_MAX_DRAFT_LEN) in shown("serve", "max_draft_len")
    assert str(TORCH_DEFAULT_MAX_BATCH_SIZE) in shown("serve", "max_batch_size")
    assert str(TORCH_DEFAULT_MAX_SEQ_LEN) in shown("serve", "max_seq_len")
    for engine, seconds in READY_TIMEOUT_S.items():
        assert f"{seconds:g} {engine}" in shown("serve", "ready_timeout")
    # a literal default of the command is the request's own default where both define one
    for command, request in (
        ("check", CheckRequest),
        ("build", BuildRequest),
        ("tune", TuneRequest),
    ):
        fields = {f.name: f.default for f in dataclasses.fields(request)}
        for param in _command(command).params:
            for name in (param.name, f"{param.name}_s"):
                if param.default is not None and fields.get(name, None) is not None:
                    if fields[name] is not dataclasses.MISSING:
                        assert fields[name] == param.default, (command, param.name)
    budget = next(p for p in _command("tune").params if p.name == "budget")
    assert budget.default == DEFAULT_BUDGET_S


@pytest.mark.parametrize("command", COMMANDS)
def test_options_sit_in_panels_the_main_ones_first(command: str) -> None:
    cmd = _command(command)
    options = [p for p in cmd.params if isinstance(p, TyperOption)]
    panels = [p.rich_help_panel for p in options]
    assert all(panel in PANELS for panel in panels), command
    assert 2 <= panels.count(MAIN) <= 6, command
    titles = [t for t in re.findall(r"╭─ (.+?) ─", _help(command, 80)) if t != "Arguments"]
    assert titles == [p for p in PANELS if p in titles] and titles[0] == MAIN, titles
    assert all(isinstance(p, TyperArgument) or p in options for p in cmd.params)


def _balanced(text: str) -> bool:
    return text.count("(") == text.count(")")


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_no_sentence_is_broken_inside_parentheses(command: str | None) -> None:
    # Wide: no line break at all but the source's own, and none of those inside parentheses.
    for line in _help(command, 1000).splitlines():
        cell = line.strip(BOX + " ")
        assert _balanced(" ".join(cell.split("│"))), line
    # 80 columns: every line fits, and a line of prose left open ends only where the next word
    # would not have fitted (rich's wrap, not a hard break from the source).
    lines = _help(command, 80).splitlines()
    assert all(len(line) <= 80 for line in lines)
    for line, following in zip(lines, lines[1:], strict=False):
        if line.strip()[:1] in tuple(BOX) or _balanced(line) or not following.strip():
            continue
        next_word = following.split()[0]
        assert len(line.rstrip()) + 1 + len(next_word) > 80 - 1, (line, following)
