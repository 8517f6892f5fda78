#!/usr/bin/env bash
# One call on the GPU machine: every GPU test, in two processes at once (the whole-network files, and
# everything else), then, with BENCH=1, the GPU benchmarks; logs and the bench summary JSON under $OUT.
# The two processes run side by side to fit one call of the device tool (600 s); the benchmarks do not
# fit beside them: run those in a call of their own (docs/performance.md#device-check).
# Usage (from the repository root): [BENCH=1] bash tools/device_check.sh [pytest -k expression]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/device_check}
mkdir -p "$OUT"
filter=()
[ $# -gt 0 ] && filter=(-k "$1")
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu_info.txt"
models=(tests/test_models_yolov10.py tests/test_models_graph.py tests/test_models_fused.py tests/test_models_half.py
        tests/test_parallel.py tests/test_spread.py tests/test_devices.py tests/test_model_cli.py)
ignored=()
for file in "${models[@]}"; do ignored+=(--ignore="$file"); done
options=(-q -m gpu -p no:cacheprovider --benchmark-disable --durations=8 "${filter[@]}")
status=0
timeout 420 python3 -m pytest "${options[@]}" tests --ignore=tests/bench "${ignored[@]}" >"$OUT/gpu_tests_ops.log" 2>&1 &
ops=$!
timeout 420 python3 -m pytest "${options[@]}" "${models[@]}" >"$OUT/gpu_tests_models.log" 2>&1 &
whole=$!
wait "$ops" || status=1
wait "$whole" || status=1
for log in "$OUT/gpu_tests_ops.log" "$OUT/gpu_tests_models.log"; do
    echo "=== $log"
    grep -E "^(FAILED|ERROR)|passed|failed|error" "$log" | tail -20
done
if [ "${BENCH:-0}" = 1 ]; then
    echo "=== benchmarks"
    BENCH_SUMMARY_JSON="$OUT/bench_summary.json" timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/bench \
        --benchmark-only --benchmark-columns=median,rounds "${filter[@]}" >"$OUT/gpu_bench.log" 2>&1 || status=1
    # our summary closes the log (then pytest's last line); $OUT/bench_summary.json feeds tools/bench_table.py
    sed -n '/ours vs PyTorch: median/,$p' "$OUT/gpu_bench.log"
fi
exit "$status"
