"""The two workloads of issue 21's method sweeps (benchmarks/tune_vs_method_sweep.py): code,
where n-gram lookup is strong, and prose, where it is weak."""

from __future__ import annotations

import json
from pathlib import Path

CODE_MODULES = (
    "argparse", "textwrap", "shlex", "fractions", "heapq", "bisect", "statistics", "difflib",
    "string", "calendar", "colorsys", "ipaddress", "json/encoder", "csv", "glob", "fnmatch",
)  # fmt: skip
PROSE_OBJECTS = (
    "textwrap.dedent", "statistics.quantiles", "heapq.merge", "bisect.insort_right",
    "statistics.median", "difflib.SequenceMatcher", "difflib.unified_diff",
    "fractions.Fraction.limit_denominator", "ipaddress.ip_network", "json.dumps", "json.loads",
    "glob.glob", "functools.reduce", "functools.lru_cache", "itertools.groupby",
    "collections.namedtuple",
)  # fmt: skip


def named_workload(name: str, out: Path) -> Path:
    """``code`` (16 pieces of Python from the standard library, each from its first ``def`` or ``class``) or
    ``prose`` (16 standard-library docstrings) as a workload file ``OUT/<name>.jsonl``: the two
    workloads of the method sweeps, where n-gram lookup is strong and where it is weak."""
    import importlib
    import inspect
    import sysconfig

    prompts = []
    if name == "code":
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        for module in CODE_MODULES:
            text = (stdlib / f"{module}.py").read_text(encoding="utf-8")
            start = min(i for i in (text.find("\ndef "), text.find("\nclass ")) if i >= 0) + 1
            prompts.append(text[start : start + 900])
    else:
        for dotted in PROSE_OBJECTS:
            module, _, rest = dotted.partition(".")
            obj = importlib.import_module(module)
            for part in rest.split("."):
                obj = getattr(obj, part)
            prompts.append(f"{dotted}\n\n{inspect.getdoc(obj)[:900]}")
    path = out / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "category": name}) + "\n" for p in prompts))
    return path
