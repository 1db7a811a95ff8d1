"""The ``spectool`` command: parse, call the library, render. Only this module exits.

Each subcommand lives in its own module (``check.py``, ``build.py``, ``serve.py``, ``tune.py``)
exposing ``register(app)``; heavy libraries are imported inside the command bodies so that
``spectool --help`` stays fast and never imports torch or transformers.
"""

from __future__ import annotations

import sys

import typer

from spectool import __version__
from spectool.constants import DEBUG
from spectool.errors import SpectoolError

app = typer.Typer(
    name="spectool",
    help=(
        "Will speculative decoding make this model faster for our traffic, on our GPU? "
        "Check a target/drafter pair, build TensorRT-LLM configs, serve, and tune the draft "
        "length per concurrency from measurements."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"spectool {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
) -> None:
    """spectool: honest speculative-decoding decisions for TensorRT-LLM."""


def _register_commands() -> None:
    from spectool.cli import check

    check.register(app)
    for name in ("build", "serve", "tune"):
        try:
            module = __import__(f"spectool.cli.{name}", fromlist=["register"])
        except ModuleNotFoundError as exc:  # a command not yet landed
            if exc.name != f"spectool.cli.{name}":
                raise
            continue
        module.register(app)


_register_commands()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map spectool's own errors to one stderr line and their exit code."""
    try:
        # Non-standalone click returns a command's typer.Exit code instead of raising it.
        code = app(args=argv, standalone_mode=False)
    except SpectoolError as exc:
        if DEBUG:
            raise
        print(f"spectool: error: {exc}", file=sys.stderr)  # noqa: T201
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("spectool: aborted", file=sys.stderr)  # noqa: T201
        return 130
    except KeyboardInterrupt:
        print("spectool: interrupted", file=sys.stderr)  # noqa: T201
        return 130
    except Exception as exc:
        # Usage errors (click's ClickException: unknown option, bad value) arrive here in
        # non-standalone mode. typer bundles its own copy of click, so match by behaviour.
        if callable(getattr(exc, "show", None)) and isinstance(
            getattr(exc, "exit_code", None), int
        ):
            exc.show()
            return 2
        raise
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
