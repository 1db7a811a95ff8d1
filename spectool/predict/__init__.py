"""Predict speculative speed-up before renting a GPU (placeholder; documented below)."""

from spectool.predict.acceptance import Acceptance
from spectool.predict.cost import ENGINE_DEFAULTS, EngineFactors, Hardware, forward_cost
from spectool.predict.geometry import Geometry, geometry_from_checkpoint, geometry_from_mapping
from spectool.predict.model import Setup, predict, speedup

__all__ = [
    "ENGINE_DEFAULTS",
    "Acceptance",
    "EngineFactors",
    "Geometry",
    "Hardware",
    "Setup",
    "forward_cost",
    "geometry_from_checkpoint",
    "geometry_from_mapping",
    "predict",
    "speedup",
]
