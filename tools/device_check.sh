#!/usr/bin/env bash
# One call on the GPU machine: the GPU tests, then the GPU benchmarks, logs and the summary JSON under $OUT.
# Usage (from the repository root): bash tools/device_check.sh [pytest -k expression]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/device_check}
mkdir -p "$OUT"
filter=()
[ $# -gt 0 ] && filter=(-k "$1")
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu_info.txt"
timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider --benchmark-disable "${filter[@]}" tests \
    --ignore=tests/bench 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
echo "=== benchmarks"
BENCH_SUMMARY_JSON="$OUT/bench_summary.json" timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/bench \
    --benchmark-only --benchmark-columns=median,rounds "${filter[@]}" 2>&1 > "$OUT/gpu_bench.log"
# our summary closes the log (then pytest's last line); $OUT/bench_summary.json feeds tools/bench_table.py
sed -n '/ours vs PyTorch: median/,$p' "$OUT/gpu_bench.log"
