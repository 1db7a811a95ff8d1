"""Turn a tune decision into files: ``DIR/decision.json`` and a build folder in ``DIR`` itself.

``decision.json`` is :meth:`spectool.decide.tune.TuneResult.to_decision_json` (what ``build
--decision`` and ``serve``'s cost gate read). The serving configs are then written by
``spectool build``'s own code (:mod:`spectool.deploy.build`) with ``--decision DIR/decision.json
--out DIR``, so ``DIR`` is also a build folder ``spectool serve DIR`` can run:

* TensorRT-LLM: ``speculative.yaml`` carrying the per-concurrency choices as the release allows
  (``draft_len_schedule``, else ``max_concurrency``, else no gate and serve's cost gate), and
  ``baseline.yaml``;
* embedded engine: ``speculative.json`` / ``baseline.json`` (its EngineConfig, the schedule in
  ``draft_len_schedule`` or ``max_concurrency``);
* ``manifest.json``.

When speculation pays nowhere the speculative config keeps the searched ``max_draft_len`` (it
is still a valid config) and the manifest says so; ``serve`` then runs the baseline.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from spectool.decide.tune import TuneResult
from spectool.errors import IncompatibleError
from spectool.io import atomic_write_text
from spectool.tuning.request import ResolvedTune
from spectool.tuning.setup import DECISION_NAME


@dataclass(frozen=True)
class Deployment:
    """What was written: ``decision.json``, the build's files, and the build's notes."""

    decision_path: Path
    build_files: tuple[Path, ...]
    notes: tuple[str, ...]


def write_decision(
    result: TuneResult, out: Path, *, extra: Mapping[str, object] | None = None
) -> Path:
    """``DIR/decision.json`` (2-space JSON, trailing newline), atomically; ``extra`` keys
    (a method comparison's ``methods``) are added to the decision's."""
    text = json.dumps({**result.to_decision_json(), **(extra or {})}, indent=2) + "\n"
    return atomic_write_text(out / DECISION_NAME, text)


def write_deployment(
    resolved: ResolvedTune,
    result: TuneResult,
    out: Path,
    *,
    extra: Mapping[str, object] | None = None,
) -> Deployment:
    """Write ``decision.json``, then the build folder for it in ``out`` (module docstring)."""
    decision_path = write_decision(result, out, extra=extra)
    written, notes = build_for_decision(resolved, decision_path, result.max_draft_len)
    return Deployment(decision_path, written, notes)


def build_for_decision(
    resolved: ResolvedTune, decision_path: Path, decided_max_draft_len: int
) -> tuple[tuple[Path, ...], tuple[str, ...]]:
    """The build folder for ``decision_path`` in its own folder (measured or predicted)."""
    from spectool.deploy.build import check_build, plan_build, write_build

    out = decision_path.parent
    # the decision's own max_draft_len wins when it speculates (build checks they agree); DIR
    # holds tune's own files and build replaces only its own (force)
    max_draft_len = None if decided_max_draft_len > 0 else resolved.max_draft_len
    inputs = check_build(
        resolved.build_request(out, max_draft_len=max_draft_len, decision=decision_path)
    )
    if inputs.report.errors:
        problems = "; ".join(f.message for f in inputs.report.errors)
        raise IncompatibleError(f"the build for the decision was refused: {problems}")
    plan = plan_build(inputs)
    written = write_build(plan, force=True)
    return tuple(written), (*plan.warnings, *plan.notes)
