#!/usr/bin/env bash
# One call on the GPU machine: the GPU tests, then the GPU benchmarks, logs under $OUT.
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
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/bench --benchmark-only \
    --benchmark-columns=median,rounds "${filter[@]}" 2>&1 > "$OUT/gpu_bench.log"
sed -n '/median time, achieved bandwidth/,/^$/p' "$OUT/gpu_bench.log"
tail -3 "$OUT/gpu_bench.log"
