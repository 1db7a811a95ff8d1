"""How ``--help`` reads: options in panels, flags shown as flags, every default shown and true.

Conventions of typer/click CLIs (``rich_help_panel``, ``show_default``): the panels run from the
few options that matter (:data:`MAIN`) to :data:`ADVANCED`. A default the code computes (an
engine's concurrencies, a release) is shown from the constant the code uses; when that constant
lives in a module too heavy to import for every ``spectool`` start, the command's
``help_defaults`` callable imports it only when help is drawn.
"""

from __future__ import annotations

import copy
import inspect
import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, get_args

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

MAIN = "Main options"
WORKLOAD = "Workload"
LOAD = "Load"
PREDICTION = "Prediction"
ENGINE = "Engine"
OUTPUT = "Output"
ADVANCED = "Advanced"
# The order panels are drawn in (typer draws them in the order their first option comes).
PANELS = (MAIN, WORKLOAD, LOAD, PREDICTION, ENGINE, OUTPUT, ADVANCED)


def option(alias: Any, *, panel: str | None = None, default: str | None = None) -> Any:
    """A copy of the ``Annotated`` option ``alias`` shown in another panel and/or with another
    shown default (``default``: the words after ``default:``)."""
    base, info = get_args(alias)[0], copy.copy(alias.__metadata__[0])
    if panel is not None:
        info.rich_help_panel = panel
    if default is not None:
        info.show_default = default
    return Annotated[base, info]


def unwrap(text: str | None) -> str | None:
    """Paragraphs of a docstring with their single line breaks joined: rich wraps them at the
    terminal's width, never where the source line ended."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(re.sub(r"\s*\n\s*", " ", p) for p in paragraphs)


def _as_flag(param: Any) -> None:
    """A boolean flag takes no value: no ``<bool>`` beside it."""
    if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
        param.metavar = ""


def _panel_rank(param: Any) -> int:
    panel = getattr(param, "rich_help_panel", None)
    if not isinstance(param, TyperOption):
        return -1  # arguments first
    return PANELS.index(panel) if panel in PANELS else len(PANELS)


class SpectoolCommand(TyperCommand):
    """A command whose help joins docstring lines, shows flags as flags and fills in the
    defaults of :attr:`help_defaults` (parameter name -> shown text) when help is drawn."""

    help_defaults: ClassVar[Callable[[], dict[str, str]] | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = unwrap(self.help)
        for param in self.params:
            _as_flag(param)
        self.params.sort(key=_panel_rank)  # stable: within a panel, the signature's order

    def get_help_option(self, ctx: Any) -> Any:
        help_option = super().get_help_option(ctx)
        if help_option is not None:
            _as_flag(help_option)
            help_option.rich_help_panel = OUTPUT
        return help_option

    def format_help(self, ctx: Any, formatter: Any) -> None:
        lazy = type(self).help_defaults
        if lazy is not None:
            shown = lazy()
            for param in self.params:
                if param.name in shown:
                    param.show_default = shown[param.name]
        super().format_help(ctx, formatter)


class SpectoolGroup(TyperGroup):
    """The ``spectool`` group: its help too shows flags as flags."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            _as_flag(param)

    def get_help_option(self, ctx: Any) -> Any:
        help_option = super().get_help_option(ctx)
        if help_option is not None:
            _as_flag(help_option)
        return help_option


def command_class(
    help_defaults: Callable[[], dict[str, str]] | None = None,
    base: type[SpectoolCommand] = SpectoolCommand,
) -> type[SpectoolCommand]:
    """A :class:`SpectoolCommand` subclass (of ``base``) whose help shows ``help_defaults``."""
    return type(base.__name__, (base,), {"help_defaults": staticmethod(help_defaults)})


def register(app: typer.Typer, name: str, function: Callable[..., Any], **settings: Any) -> None:
    """``app.command(name)(function)`` with :class:`SpectoolCommand` unless ``settings`` name
    another ``cls``."""
    settings.setdefault("cls", SpectoolCommand)
    app.command(name, **settings)(function)
