"""The ``spectool`` command: parse, call the library, render. Only this module exits.

Each subcommand lives in its own module (``check.py``, ``build.py``, ``serve.py``, ``tune.py``)
exposing ``register(app)``; heavy libraries are imported inside the command bodies so that
``spectool --help`` stays fast and never imports torch or transformers.
"""

from __future__ import annotations

import json
import sys

import typer

from spectool import __version__
from spectool.cli.help import SpectoolGroup
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
    cls=SpectoolGroup,
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


def _json_error(wanted: bool, kind: str, message: str, exit_code: int, where: str | None) -> None:
    """With ``--json``, every failure is also one JSON object on stdout: ``{"error": {...}}``."""
    if wanted:
        error = {"type": kind, "message": message, "where": where, "exit_code": exit_code}
        sys.stdout.write(json.dumps({"error": error}, indent=2) + "\n")
        sys.stdout.flush()


def _forget_handled_interrupts() -> None:
    """Keep the exit code ``main`` returns after a KeyboardInterrupt it handled.

    CPython marks the process as ended by Ctrl-C whenever a KeyboardInterrupt leaves a string
    ``eval``/``exec``, even one caught later (``run_eval_code_obj`` in Python/pythonrun.c, read
    for 3.11 and 3.12); under ``python -m`` the interpreter then kills itself with SIGINT at
    exit instead of exiting with the code given to ``sys.exit``. A stop (Ctrl-C, or SIGTERM
    turned into it) lands wherever the main thread is, and a lazy import runs such strings
    (dataclasses, numpy.f2py under scipy.stats): a SIGTERMed ``python -m spectool.cli.app
    tune`` died by SIGINT instead of exiting 130 (once in CI; beside a CPU hog within 4-10
    runs). Every string eval clears the mark first."""
    eval("None", {})  # noqa: S307 (a constant: clears the interpreter's stale interrupt mark)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map spectool's own errors to one stderr line and their exit code."""
    code = _main(argv)
    _forget_handled_interrupts()  # every exit code returned here is one the CLI decided
    return code


def _main(argv: list[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
    try:
        # Non-standalone click returns a command's typer.Exit code instead of raising it.
        code = app(args=args, standalone_mode=False)
    except SpectoolError as exc:
        if DEBUG:
            raise
        print(f"spectool: error: {exc}", file=sys.stderr)  # noqa: T201
        where = getattr(exc, "where", None)
        problem = getattr(exc, "problem", str(exc))
        _json_error(as_json, type(exc).__name__, problem, exc.exit_code, where)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt) as exc:
        what = "aborted" if isinstance(exc, typer.Abort) else "interrupted"
        print(f"spectool: {what}", file=sys.stderr)  # noqa: T201
        _json_error(as_json, what, what, 130, None)
        return 130
    except Exception as exc:
        # Usage errors (click's ClickException: unknown option, bad value) arrive here in
        # non-standalone mode. typer bundles its own copy of click, so match by behaviour.
        if callable(getattr(exc, "show", None)) and isinstance(
            getattr(exc, "exit_code", None), int
        ):
            exc.show()
            _json_error(as_json, "UsageError", exc.format_message(), 2, None)
            return 2
        raise
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
