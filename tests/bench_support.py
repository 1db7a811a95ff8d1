"""Helpers for tests of the scripts in benchmarks/ (not a package: loaded by file path)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(filename: str) -> ModuleType:
    """The module of ``benchmarks/FILENAME``, executed (its ``main`` is not run)."""
    path = BENCHMARKS / filename
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass in the script looks its module up there
    spec.loader.exec_module(module)
    return module
