"""How fast is a prediction? (done-when 4: well under 100 ms of pure Python.)

Predicts one profile (``llama-3.1-8b-eagle3``: its geometry block, an H100, trtllm defaults,
a constant acceptance) for concurrencies 1, 8, 64 and k = 1..8, with and without acceptance
(the break-even search), and times it, geometry from the profile included.

    python benchmarks/predict_speed.py [--repeats 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_MS = 100.0
PROFILE = "llama-3.1-8b-eagle3"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    t_import = time.perf_counter()
    from spectool.predict import Acceptance, predict, setup_for
    from spectool.predicted import pair_geometry
    from spectool.profiles import load_gpu, load_profile

    import_ms = (time.perf_counter() - t_import) * 1e3

    def once(acceptance: bool) -> float:
        t0 = time.perf_counter()
        geom = pair_geometry(None, None, "eagle3", load_profile(PROFILE), PROFILE)
        setup = setup_for(
            geom.target, "eagle3", load_gpu("h100-sxm"), drafter=geom.drafter, engine="trtllm"
        )
        acc = Acceptance.from_rate(0.7, "bench") if acceptance else None
        predict(setup, acc, concurrencies=(1, 8, 64), ks=range(1, 9))
        return (time.perf_counter() - t0) * 1e3

    ok = True
    print(f"import spectool.predict + profiles: {import_ms:.0f} ms (once per process)")
    for acceptance in (True, False):
        once(acceptance)
        times = [once(acceptance) for _ in range(args.repeats)]
        med = statistics.median(times)
        ok &= med < TARGET_MS
        label = "with acceptance (+ break-even concurrency)" if acceptance else "break-even only"
        print(
            f"predict c=1,8,64 x k=1..8, {label}: median {med:.1f} ms, "
            f"max {max(times):.1f} ms (target < {TARGET_MS:.0f} ms)"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
