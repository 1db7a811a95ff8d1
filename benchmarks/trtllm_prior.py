"""Server starts the roofline prior saves tune on TensorRT-LLM, and whether its choices move.

Every draft length is a trtllm-serve start (minutes). Without a prior the search plans three
(k = 0, K, 1); with the prior (:mod:`spectool.tuning.prior`) the k = 1 cost cell is replaced by
the measured k = K step scaled by the roofline. No GPU here, so each setup of the published table
(``tests/data/published/``: model, drafter, method, GPU, TP, chain drafting, with its published
acceptance length and draft length) becomes a synthetic serving world whose TRUE step times are
the roofline with its engine factors perturbed (a machine the defaults do not describe), while
the prior uses the defaults. Both searches run on the same world (same noise); the table gives
the server starts (distinct k measured), the cells measured, and whether the choices agree.

    python benchmarks/trtllm_prior.py [--concurrency 1,2,4,8,16,32,64]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from decide.world import World  # noqa: E402

from spectool.decide.chain import constant_alpha_for  # noqa: E402
from spectool.decide.tune import tune  # noqa: E402
from spectool.predict.model import Setup  # noqa: E402
from spectool.predict.published import (  # noqa: E402
    engine_factors,
    geometry_from_published,
    hardware_for,
    load_models,
    load_rows,
    skip_reason,
)

DATA = ROOT / "tests" / "data" / "published"
# How the true machine differs from the defaults: overheads and achieved bandwidth.
PERTURBATIONS = {
    "defaults": {},
    "slow host": {"step_overhead_s": 2.0, "spec_overhead_s": 2.0},
    "low bandwidth": {"bw_fraction": 0.7},
}


@dataclasses.dataclass(frozen=True)
class RooflineWorld(World):
    """A World whose mean step time is a roofline Setup's (ms)."""

    setup: Setup | None = None

    def step_ms(self, batch: float, k: int) -> float:
        assert self.setup is not None
        b = max(1, round(batch))
        s = self.setup.base_step(b) if k == 0 else self.setup.spec_step(b, k, 1.0, 0.0)
        return s * 1e3


def _scale(setup: Setup, changes: dict[str, float]) -> Setup:
    f = setup.factors
    factors = dataclasses.replace(f, **{name: getattr(f, name) * x for name, x in changes.items()})
    return dataclasses.replace(setup, factors=factors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,2,4,8,16,32,64")
    args = parser.parse_args()
    concs = tuple(int(c) for c in args.concurrency.split(","))
    models = load_models(DATA)
    seen: set[tuple[object, ...]] = set()
    rows = []
    for row in load_rows(DATA):
        key = (row.model, row.drafter, row.method, row.engine, row.gpu, row.tp, row.draft_len)
        if skip_reason(row) or row.drafting != "chain" or key in seen:
            continue
        if row.method not in ("draft_model", "eagle3", "eagle", "eagle2") or row.draft_len < 2:
            continue
        seen.add(key)
        rows.append(row)
    print(f"{'setup':58} {'world':13} {'starts':>9} {'cells':>7} same choices")
    totals = {"without": 0, "with": 0, "rows": 0, "same": 0}
    for row in rows:
        method = {"eagle2": "eagle"}.get(row.method, row.method)
        setup = Setup(
            target=geometry_from_published(models[row.model], row.model, row.precision),
            method=method,
            hardware=hardware_for(row.gpu),
            factors=engine_factors(row.engine),
            drafter=geometry_from_published(models[row.drafter], row.drafter, row.precision),
            tp=row.tp,
        )
        alpha = constant_alpha_for(row.acceptance_length, row.draft_len, row.row_id)
        for name, changes in PERTURBATIONS.items():
            world = RooflineWorld(
                alphas=(alpha,) * row.draft_len, setup=_scale(setup, changes), noise=0.03
            )

            def prior(batch: float, k: int, _setup: Setup = setup) -> float:
                b = max(1, round(batch))
                return _setup.base_step(b) if k == 0 else _setup.spec_step(b, k, 1.0, 0.0)

            calls: dict[str, list[tuple[int, int]]] = {"without": [], "with": []}
            choices = {}
            for arm in ("without", "with"):

                def measure(c: int, k: int, _log=calls[arm], _world=world):  # noqa: ANN001, ANN202
                    _log.append((c, k))
                    return _world.measure(c, k)

                result = tune(
                    concs,
                    row.draft_len,
                    measure,
                    n_boot=200,
                    prior_step=prior if arm == "with" else None,
                )
                choices[arm] = result.choices
            starts = {arm: len({k for _, k in calls[arm]}) for arm in calls}
            same = choices["with"] == choices["without"]
            totals["without"] += starts["without"]
            totals["with"] += starts["with"]
            totals["rows"] += 1
            totals["same"] += same
            label = f"{row.model} + {row.drafter} ({method}, k={row.draft_len}) {row.gpu}"
            print(
                f"{label[:58]:58} {name:13} {starts['without']:>3} -> {starts['with']:<3} "
                f"{len(calls['without']):>3}->{len(calls['with']):<3} {'yes' if same else 'NO'}"
            )
    print(
        f"\nserver starts: {totals['without']} without the prior, {totals['with']} with it "
        f"({totals['without'] - totals['with']} saved over {totals['rows']} runs); the same "
        f"choices in {totals['same']} of {totals['rows']}"
    )


if __name__ == "__main__":
    main()
