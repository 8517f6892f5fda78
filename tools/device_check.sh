#!/usr/bin/env bash
# One call on the GPU machine: every GPU test, in four processes at once (the whole-network files split
# in two, and the other test files dealt out alternately to two), then, with BENCH=1, the GPU benchmarks; logs and the
# bench summary JSON under $OUT. The processes run side by side to fit one call of the device tool (600 s)
# with room to spare: two of them took 407 s and 395 s side by side (2026-12-03); the benchmarks do not fit
# beside them: run those in a call of their own (docs/performance.md#device-check).
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
# The whole-network files, in two processes: alone they took 395 s (2026-12-03), the longest of the three.
models_a=(tests/test_models_yolov10.py tests/test_models_fused.py tests/test_parallel.py tests/test_devices.py)
models_b=(tests/test_models_graph.py tests/test_models_half.py tests/test_spread.py tests/test_model_cli.py)
# Every other test file (tests/bench apart), dealt out alternately to two processes.
ops_a=()
ops_b=()
for file in tests/test_*.py; do
    [[ " ${models[*]} " == *" $file "* ]] && continue
    if [ $(( (${#ops_a[@]} + ${#ops_b[@]}) % 2 )) -eq 0 ]; then ops_a+=("$file"); else ops_b+=("$file"); fi
done
options=(-q -m gpu -p no:cacheprovider --benchmark-disable --durations=8 "${filter[@]}")
status=0
pids=()
# Stopped from outside (a caller's timeout, Ctrl-C), stop the test processes too: left running, they would share
# the GPU with whatever the caller runs next, and slow what it times.
trap 'kill "${pids[@]}" 2>/dev/null; exit 124' TERM INT
timeout 540 python3 -m pytest "${options[@]}" "${ops_a[@]}" >"$OUT/gpu_tests_ops_a.log" 2>&1 &
pids+=($!)
timeout 540 python3 -m pytest "${options[@]}" "${ops_b[@]}" >"$OUT/gpu_tests_ops_b.log" 2>&1 &
pids+=($!)
timeout 540 python3 -m pytest "${options[@]}" "${models_a[@]}" >"$OUT/gpu_tests_models_a.log" 2>&1 &
pids+=($!)
timeout 540 python3 -m pytest "${options[@]}" "${models_b[@]}" >"$OUT/gpu_tests_models_b.log" 2>&1 &
pids+=($!)
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done
for log in "$OUT"/gpu_tests_*.log; do
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
