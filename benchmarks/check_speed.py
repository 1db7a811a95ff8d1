"""Speed target of `spectool check`: Llama-3.1-8B-Instruct against its EAGLE-3 head from local
folders reads headers only, in under 1 s wall and 200 MB peak RSS on 2 cores.

Builds the two folders from ../shared/fixtures (sparse files: exact headers, no data), then runs
the real CLI as a separate process several times and prints wall time and peak RSS (from
``resource.getrusage(RUSAGE_CHILDREN)`` after each run).

    python benchmarks/check_speed.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from ckpt_factory import build_checkpoint  # noqa: E402

WALL_TARGET_S = 1.0
RSS_TARGET_MB = 200.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    spectool = [sys.executable, "-m", "spectool.cli.app"]
    with tempfile.TemporaryDirectory() as tmp:
        target = build_checkpoint("meta-llama/Llama-3.1-8B-Instruct", Path(tmp))
        head = build_checkpoint("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", Path(tmp))
        cmd = [*spectool, "check", str(target), str(head), "--gpu", "H100 SXM", "--json"]
        walls, rss = [], []
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        for _ in range(args.runs + 1):  # the first run warms the page cache and is dropped
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, env=env, check=False)
            walls.append(time.perf_counter() - t0)
            rss.append(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
            if proc.returncode != 0:
                print(proc.stdout.decode(), proc.stderr.decode())
                return 1
        walls = walls[1:]
        median = statistics.median(walls)
        peak = max(rss)
        print(f"check Llama-3.1-8B + EAGLE3 head: wall median {median:.3f} s "
              f"(min {min(walls):.3f}, max {max(walls):.3f}, {args.runs} runs); peak RSS {peak:.0f} MB")
        print(f"targets: wall < {WALL_TARGET_S} s -> {'met' if median < WALL_TARGET_S else 'MISSED'}; "
              f"RSS < {RSS_TARGET_MB} MB -> {'met' if peak < RSS_TARGET_MB else 'MISSED'}")
        return 0 if median < WALL_TARGET_S and peak < RSS_TARGET_MB else 1


if __name__ == "__main__":
    sys.exit(main())
