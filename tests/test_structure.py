"""Package-wide structure: module imports form no cycle, and no module grows past 500 lines.

Imports are read with :mod:`ast` from every module of ``spectool`` (top level, inside functions,
under ``TYPE_CHECKING``; relative imports resolved), so a cycle hidden behind a lazy import
counts as a cycle too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import spectool

PACKAGE_DIR = Path(spectool.__file__).resolve().parent
MAX_LINES = 500


def module_name(path: Path) -> str:
    """``spectool.a.b`` for ``spectool/a/b.py``; ``spectool.a`` for ``spectool/a/__init__.py``."""
    parts = ("spectool", *path.relative_to(PACKAGE_DIR).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The ``spectool`` modules ``path`` imports anywhere in its body.

    ``from pkg import x`` counts as importing ``pkg.x`` when that is a module, else ``pkg``.
    """
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    known = set(modules)
    return {name: imported_modules(name, path, known) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path = [root]
        stack = [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_graph_sees_imports() -> None:
    """The walker finds lazy, TYPE_CHECKING and relative imports (else the cycle test is void)."""
    graph = import_graph()
    assert len(graph) > 50
    assert "spectool.errors" in graph["spectool.decide.cost"]
    assert "spectool.tuning.report" in graph["spectool.tuning.outputs"]  # imported in a function


def test_find_cycle_reports_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_modules_stay_small() -> None:
    sizes = {
        path.relative_to(PACKAGE_DIR).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in PACKAGE_DIR.rglob("*.py")
    }
    too_long = {rel: n for rel, n in sorted(sizes.items()) if n > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines: {too_long}"
