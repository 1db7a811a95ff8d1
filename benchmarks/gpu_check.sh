#!/usr/bin/env bash
# The embedded engine on CUDA in one short run: greedy identity against the CPU, decode tokens/s
# at batch 1 and 16, and the speculative speed-up (benchmarks/gpu_check.py says what and how).
# Run from anywhere: benchmarks/gpu_check.sh [--device cuda|cuda:N|cpu] [--rounds 3] ...
# Capped at 5 minutes; exit 1 when greedy tokens differ from the CPU's, 124 on the time cap.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python}"
exec timeout 300 "$python" "$here/gpu_check.py" "$@"
