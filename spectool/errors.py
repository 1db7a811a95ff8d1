"""Every error spectool raises on purpose, grouped, each with the exit code the CLI maps it to.

Raise deep, typed and specific; only ``spectool.cli.app`` turns an error into one stderr line and
an exit code (a traceback only with ``SPECTOOL_DEBUG=1``).
"""

from __future__ import annotations

from pathlib import Path


class SpectoolError(Exception):
    """Base of every error spectool raises on purpose."""

    exit_code: int = 1


class BadInputError(SpectoolError, ValueError):
    """The user gave something unusable: a missing folder, malformed JSON, an unknown name.

    Exit code 2. The message names the file (or option) and the problem in one line.
    """

    exit_code = 2

    def __init__(self, where: str | Path | None, problem: str) -> None:
        self.where = str(where) if where is not None else None
        self.problem = problem
        super().__init__(f"{self.where}: {problem}" if self.where else problem)


class CheckpointError(BadInputError):
    """A checkpoint file or folder cannot be read as what it claims to be."""


class ProfileError(BadInputError):
    """An unknown profile or GPU name, or a malformed profile file."""


class HubError(BadInputError):
    """A Hugging Face reference cannot be resolved (offline and not cached, gated, missing)."""


class ConfigError(BadInputError):
    """A generated or user-supplied engine configuration is invalid for the chosen release."""


class OutputExistsError(BadInputError):
    """Refusing to overwrite a user's file without ``--force``."""


class IncompatibleError(SpectoolError):
    """The checker found errors; the command refuses to go on (exit code 1)."""

    exit_code = 1


class EngineMissingError(SpectoolError):
    """A required external program (``trtllm-serve``, ``trtllm-build``) is not installed."""

    exit_code = 2


class ChildProcessError_(SpectoolError):
    """A launched child process failed (server died, build failed). Exit code 3."""

    exit_code = 3


class EngineLoadError(SpectoolError):
    """The embedded engine could not load the model it was asked to serve (exit code 3)."""

    exit_code = 3


class BuildMismatchError(IncompatibleError):
    """A build folder does not fit this machine (GPU architecture or memory, TensorRT-LLM
    version, missing engines, changed checkpoints); ``serve`` refuses it (exit code 1)."""
