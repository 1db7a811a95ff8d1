"""How fast is a prediction? (done-when 4: well under 100 ms of pure Python.)

Predicts one profile (Llama-3.1-8B + EAGLE-3 head on an H100, trtllm defaults, a constant
acceptance) for concurrencies 1, 8, 64 and k = 1..8, with and without acceptance (the
break-even search), and times it; also the whole CLI-like path from the profile's geometry.

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

LLAMA_8B = {
    "num_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "head_dim": 128,
    "num_kv_heads": 8,
    "dense_params": 7.5e9,
    "lm_head_params": 5.25e8,
    "weight_dtype": "bf16",
}
EAGLE3_HEAD = {**LLAMA_8B, "num_layers": 1, "dense_params": 3.0e8, "lm_head_params": 1.3e8}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    t_import = time.perf_counter()
    from spectool.predict import Acceptance, geometry_from_mapping, predict, setup_for
    from spectool.profiles import load_gpu

    import_ms = (time.perf_counter() - t_import) * 1e3

    def once(acceptance: bool) -> float:
        t0 = time.perf_counter()
        setup = setup_for(
            geometry_from_mapping(LLAMA_8B, "llama-3.1-8b"),
            "eagle3",
            load_gpu("h100-sxm"),
            drafter=geometry_from_mapping(EAGLE3_HEAD, "eagle3-head"),
            engine="trtllm",
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
