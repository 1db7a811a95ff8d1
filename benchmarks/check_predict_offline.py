"""Speed target of `spectool check`'s "will it pay" from a profile alone, offline: under 1 s.

Runs ``spectool check llama-3.1-8b-eagle3 --gpu h100-sxm --concurrency 1,8,64`` as a separate
process with ``HF_HUB_OFFLINE=1`` and an empty Hugging Face cache (nothing to read: the
prediction comes from the profile's geometry block), several times, and prints the wall times,
the median, and whether the output held the prediction (exit 3 = unverified, as expected).

    python benchmarks/check_predict_offline.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 1.0
ARGV = ["check", "llama-3.1-8b-eagle3", "--gpu", "h100-sxm", "--concurrency", "1,8,64"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as empty:
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "HF_HOME": empty,
            "SPECTOOL_CACHE": str(Path(empty) / "spectool"),
            "PYTHONPATH": str(ROOT),
        }
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "spectool.cli.app", *ARGV],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            times.append(time.perf_counter() - start)
            if done.returncode != 3 or "c=8: speculation pays" not in done.stdout:
                print(f"unexpected result (exit {done.returncode}):\n{done.stdout}{done.stderr}")
                return 1
    median = statistics.median(times)
    print("wall s: " + ", ".join(f"{t:.2f}" for t in times) + f"; median {median:.2f}")
    print(f"target < {TARGET_S:.1f} s: {'met' if median < TARGET_S else 'MISSED'}")
    return 0 if median < TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
