"""The CLI's side of :mod:`spectool.predict`: which geometry, acceptance and calibration a
prediction uses, chosen the same way by ``check --gpu`` and ``tune --predict-only``.

* Geometry: the checkpoints' headers when they were read, else the profile's ``geometry:``
  block (offline, nothing downloaded).
* Acceptance, best first: ``--acceptance-length`` / ``--acceptance-rate``, a previous tune run
  (``--acceptance-from DIR``: its ``tune.json``), the profile's published figure, else none
  (``check`` then answers with the break-even acceptance per concurrency).
* Calibration: the engine defaults of :data:`spectool.predict.ENGINE_DEFAULTS` for TensorRT-LLM
  on a GPU profile; the CPU probe for spectool's embedded engine (``tune`` only: it imports
  torch).

Torch-free; ``check`` imports it only when ``--gpu`` names a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectool import methods
from spectool.errors import BadInputError

if TYPE_CHECKING:
    from spectool.ckpt.inspect import Checkpoint
    from spectool.predict import Acceptance, Geometry
    from spectool.profiles import Recipe

DEFAULT_CONCURRENCY = (1, 8, 64)
DEFAULT_CONTEXT = 1024
MAX_K = 8


@dataclass(frozen=True)
class AcceptanceFlags:
    """What the user passed: at most one of length / rate / a tune run's folder."""

    length: float | None = None
    rate: float | None = None
    from_dir: Path | None = None

    def given(self) -> list[str]:
        names = ("--acceptance-length", "--acceptance-rate", "--acceptance-from")
        values = (self.length, self.rate, self.from_dir)
        return [n for n, v in zip(names, values, strict=True) if v is not None]


def resolve_acceptance(
    flags: AcceptanceFlags, recipe: Recipe | None, k: int, concurrency: int | None = None
) -> Acceptance | None:
    """The acceptance input, best first (see the module docstring); None when there is none.

    ``k``: the draft length a ``--acceptance-length`` was measured at (the recipe's
    ``max_draft_len`` unless the user says otherwise).
    """
    from spectool.predict import Acceptance, acceptance_from_tune

    given = flags.given()
    if len(given) > 1:
        raise BadInputError(given[1], f"give one acceptance input, not {' and '.join(given)}")
    if flags.length is not None:
        return Acceptance.from_length(
            flags.length, k, f"--acceptance-length {flags.length:g} at k={k}"
        )
    if flags.rate is not None:
        return Acceptance.from_rate(flags.rate, f"--acceptance-rate {flags.rate:g}")
    if flags.from_dir is not None:
        path = flags.from_dir / "tune.json" if flags.from_dir.is_dir() else flags.from_dir
        if not path.is_file():
            raise BadInputError(flags.from_dir, "no tune.json here (a spectool tune run folder)")
        return acceptance_from_tune(path, concurrency=concurrency)
    if recipe is not None and recipe.acceptance is not None:
        return recipe.acceptance.to_acceptance()
    return None


@dataclass(frozen=True)
class PairGeometry:
    target: Geometry
    drafter: Geometry | None
    source: str  # "checkpoint headers" or "profile <name> (<its source>)"
    mtp_layer: Geometry | None = None  # mtp: the target's MTP module, read from its headers


def pair_geometry(
    target: Checkpoint | None,
    drafter: Checkpoint | None,
    method: str,
    recipe: Recipe | None,
    profile_name: str | None,
) -> PairGeometry:
    """Geometry from headers when both were read, else the profile's block; errors name the
    gap."""
    from spectool.predict import (
        geometry_from_checkpoint,
        geometry_from_mapping,
        mtp_geometry_from_checkpoint,
    )

    needs_drafter = method in methods.DRAFTER_GEOMETRY_METHODS
    if target is not None and (drafter is not None or not needs_drafter):
        native = methods.get(method).uses_native_layers
        target_geom = geometry_from_checkpoint(target)
        return PairGeometry(
            target_geom,
            geometry_from_checkpoint(drafter) if needs_drafter and drafter else None,
            "checkpoint headers",
            mtp_geometry_from_checkpoint(target, target=target_geom) if native else None,
        )
    if recipe is None or recipe.geometry is None:
        raise BadInputError(
            profile_name or "prediction",
            "no checkpoint headers and no profile geometry block: sizes unknown",
        )
    where = f"profile {profile_name}"
    geom = recipe.geometry
    drafter_geom = (
        geometry_from_mapping(geom.drafter.model_dump(), recipe.drafter or "drafter", where)
        if geom.drafter is not None and needs_drafter
        else None
    )
    return PairGeometry(
        geometry_from_mapping(geom.target.model_dump(), recipe.target, where),
        drafter_geom,
        f"{where} ({geom.source})",
    )


def ks_for(max_draft_len: int) -> tuple[int, ...]:
    """Draft lengths to predict: 1..max(8, the recipe's)."""
    return tuple(range(1, max(MAX_K, max_draft_len) + 1))


def pays_json(prediction: Any, geometry_source: str, engine: str) -> dict[str, Any]:
    """:func:`spectool.predict.as_dict` plus where the geometry came from and the engine."""
    from spectool.predict import as_dict

    out = as_dict(prediction)
    out["geometry"] = geometry_source
    out["engine"] = engine
    return out
