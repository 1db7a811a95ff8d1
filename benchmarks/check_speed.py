"""Speed target of `spectool check`: Llama-3.1-8B-Instruct against its EAGLE-3 head from local
folders reads headers only, in under 1 s wall and 200 MB peak RSS on 2 cores.

Builds the two folders from tests/fixtures (sparse files: exact headers, no data), then runs
the real CLI as a separate process several times and prints wall time and peak RSS (from
``os.wait4`` of each run).

    python benchmarks/check_speed.py [--runs 5]
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

TESTS = Path(__file__).resolve().parents[1] / "tests"


def build(repo: str, dest: Path) -> Path:
    """Build a fixture folder in a child process, so this process stays small: a forked child
    starts with its parent's resident set, which would inflate the measured peak RSS."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from ckpt_factory import build_checkpoint;"
        "print(build_checkpoint(sys.argv[2], __import__('pathlib').Path(sys.argv[3])))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(TESTS), repo, str(dest)],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


WALL_TARGET_S = 1.0
RSS_TARGET_MB = 200.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    spectool = [sys.executable, "-m", "spectool.cli.app"]
    with tempfile.TemporaryDirectory() as tmp:
        target = build("meta-llama/Llama-3.1-8B-Instruct", Path(tmp))
        head = build("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", Path(tmp))
        cmd = [*spectool, "check", str(target), str(head), "--gpu", "H100 SXM", "--json"]
        walls, rss = [], []
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        for i in range(args.runs + 1):  # the first run warms the page cache and is dropped
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
            _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS
            walls.append(time.perf_counter() - t0)
            if i:
                rss.append(usage.ru_maxrss / 1024)
            if os.waitstatus_to_exitcode(status) != 0:
                print(proc.stderr.read().decode())
                return 1
        walls = walls[1:]
        median = statistics.median(walls)
        peak = max(rss)
        print(
            f"check Llama-3.1-8B + EAGLE3 head: wall median {median:.3f} s "
            f"(min {min(walls):.3f}, max {max(walls):.3f}, {args.runs} runs); peak RSS {peak:.0f} MB"
        )
        print(
            f"targets: wall < {WALL_TARGET_S} s -> {'met' if median < WALL_TARGET_S else 'MISSED'}; "
            f"RSS < {RSS_TARGET_MB} MB -> {'met' if peak < RSS_TARGET_MB else 'MISSED'}"
        )
        return 0 if median < WALL_TARGET_S and peak < RSS_TARGET_MB else 1


if __name__ == "__main__":
    sys.exit(main())
