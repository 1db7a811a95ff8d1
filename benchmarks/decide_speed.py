"""Speed target of spectool's decision math: one cell's bootstrap verdict (n_boot=1000) in under
50 ms for 1,000 iterations a side, and a whole ``tune`` decision on a 7 x 7 grid (measuring
excluded) in under 2 s, on 2 cores.

Cells come from the synthetic world of ``tests/decide/world.py`` and are built before timing.

    python benchmarks/decide_speed.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from decide.world import World  # noqa: E402

from spectool.decide.cost import evaluate_cell  # noqa: E402
from spectool.decide.tune import tune  # noqa: E402

CELL_TARGET_S = 0.050
TUNE_TARGET_S = 2.0


def best_of(repeats: int, fn: Callable[[], object]) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    ok = True
    for steps in (1_000, 10_000):
        world = replace(World(), steps=steps)
        base, spec = world.measure(8, 0), world.measure(8, 3)
        lo, med = best_of(args.repeats, lambda: evaluate_cell(spec, base, n_boot=1000))  # noqa: B023
        target = CELL_TARGET_S * steps / 1_000
        ok &= lo < target
        print(
            f"evaluate_cell, {steps} iterations a side, n_boot=1000: best {lo * 1e3:.1f} ms, "
            f"median {med * 1e3:.1f} ms (target {target * 1e3:.0f} ms)"
        )
    world = replace(World(with_iterations=False, with_records=True), output_tokens=128)
    base, spec = world.measure(256, 0), world.measure(256, 2)
    lo, med = best_of(args.repeats, lambda: evaluate_cell(spec, base, n_boot=1000))
    print(
        f"evaluate_cell, {len(spec.records)} requests a side, n_boot=1000: best {lo * 1e3:.1f} ms, "
        f"median {med * 1e3:.1f} ms"
    )
    world = World()
    concs = (1, 2, 4, 8, 16, 32, 64)
    cells = {(c, k): world.measure(c, k) for c in concs for k in range(7)}
    lo, med = best_of(args.repeats, lambda: tune(concs, 6, lambda c, k: cells[(c, k)]))
    ok &= lo < TUNE_TARGET_S
    print(
        f"tune, 7 concurrencies x K=6 (cells pre-built), n_boot=1000: best {lo:.2f} s, "
        f"median {med:.2f} s (target {TUNE_TARGET_S:.0f} s)"
    )
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
