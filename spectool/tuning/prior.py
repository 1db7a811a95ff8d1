"""The roofline prior of a tune: step times from first principles (:mod:`spectool.predict`) for
the checked pair, so the search measures fewer planned cells (:func:`spectool.decide.tune.tune`,
``prior_step``).

* TensorRT-LLM: every draft length is a trtllm-serve start (minutes); the prior, with the engine
  defaults for the GPU ``check`` resolved, stands in for the planned ``k = 1`` cost cell.
* The embedded engine, when tune compares methods (:mod:`spectool.tuning.compare`): a later
  method only has to show whether it can beat the ratios an earlier one measured; the prior,
  calibrated by the CPU probe (:mod:`spectool.predict.probe`), stands in for its ``k = 1`` cell,
  so it measures baselines and ``k = K`` at the smallest and largest concurrency (acceptance,
  and the step cost where speculation is dearest) before its predictions are compared.

The calibration is :func:`spectool.tuning.predicted.calibration` (the same as ``tune
--predict-only``). A probe's figures move with the machine, so they are saved in
``DIR/prior.json`` and a ``--resume`` reads them back: the resumed search predicts, and so
measures, what the first one did.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spectool.errors import SpectoolError
from spectool.io import atomic_write_text
from spectool.tuning.request import ResolvedTune
from spectool.tuning.setup import PRIOR_NAME

PriorStep = Callable[[float, int], float]


def roofline_prior(
    resolved: ResolvedTune, *, context: int, out: Path | None = None
) -> tuple[PriorStep | None, str]:
    """``(prior_step, what it rests on)``, or ``(None, why not)`` when the GPU or the models'
    geometry is unknown (the search then measures its planned cells as without a prior).
    ``out``: the run's folder, where a probe's calibration is saved and read back."""
    from spectool import profiles
    from spectool.tuning.predicted import resolved_setup

    report = resolved.report
    try:
        recipe = profiles.load_profile(report.profile) if report.profile else None
        setup, _geom, _hardware, calibrated = resolved_setup(
            resolved, recipe, context=context, calibrate=lambda r, g: _calibration(r, g, out)
        )
    except SpectoolError as exc:
        return None, f"no prior: {exc}"

    def step(batch: float, k: int) -> float:
        b = max(1, round(batch))
        return setup.base_step(b) if k == 0 else setup.spec_step(b, k, tokens=1.0, p_all=0.0)

    return step, f"roofline prior for {resolved.method}: {calibrated}"


def _calibration(resolved: ResolvedTune, geom: Any, out: Path | None) -> tuple[Any, Any, str]:
    """The calibration, read from ``out/prior.json`` when a probe saved it there."""
    from spectool.predict import EngineFactors, Hardware
    from spectool.tuning.predicted import calibration

    path = None if out is None or resolved.engine != "torch" else out / PRIOR_NAME
    if path is not None and path.is_file():
        saved = json.loads(path.read_text())
        return (
            Hardware(**saved["hardware"]),
            EngineFactors(**saved["factors"]),
            f"{saved['calibration']} (saved in {path})",
        )
    hardware, factors, calibrated = calibration(resolved, geom)
    if path is not None:
        record = {
            "hardware": dataclasses.asdict(hardware),
            "factors": dataclasses.asdict(factors),
            "calibration": calibrated,
        }
        atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    return hardware, factors, calibrated
