#!/usr/bin/env bash
# The GPU conformance run under compute-sanitizer's memcheck (with --leak-check full), racecheck,
# initcheck and synccheck, all at once, each tool's run split into shards (processes) of the
# case list, then one summary line per tool.
# Usage (repository root, on a machine with a CUDA device):
#   bash tools/sanitize.sh [conformance arguments, e.g. --op batch_matmul --schedule plain]
# Shards per tool: SHARDS_MEMCHECK (default 16; memcheck is the slowest), SHARDS (default 3)
# for the others. SANITIZER_OPTIONS: more compute-sanitizer options for every tool.
# Logs go to $OUT (default /tmp/sanitize): <tool>.<shard>.log (the sanitizer's
# report) and <tool>.<shard>.out (that shard's conformance output). Exit status 0 when every
# tool reports 0 errors (memcheck also 0 leaked bytes) and every shard's cases all passed.
set -uo pipefail
OUT=${OUT:-/tmp/sanitize}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}
tools=(memcheck racecheck initcheck synccheck)
# memcheck shows device backtraces only: to show a host backtrace, compute-sanitizer keeps the Python
# frames of every allocation's call stack alive, and with them every array and state they refer
# to, so each allocation outlives the run and is reported as leaked (docs/conformance.md#sanitizers).
declare -A options=([memcheck]="--leak-check full --show-backtrace device" [racecheck]="--racecheck-report all"
                    [initcheck]="" [synccheck]="")
declare -A shards=([memcheck]=${SHARDS_MEMCHECK:-16} [racecheck]=${SHARDS:-3} [initcheck]=${SHARDS:-3}
                   [synccheck]=${SHARDS:-3})
start=$(date +%s)
pids=()
for tool in "${tools[@]}"; do
    count=${shards[$tool]}
    for ((i = 1; i <= count; i++)); do
        # shellcheck disable=SC2086
        compute-sanitizer --tool "$tool" ${options[$tool]} ${SANITIZER_OPTIONS:-} --print-limit 50 --log-file "$OUT/$tool.$i.log" \
            "$PYTHON" -m conformance --device gpu --shard "$i/$count" "$@" >"$OUT/$tool.$i.out" 2>&1 &
        pids+=($!)
    done
done
failed_runs=0
for pid in "${pids[@]}"; do
    wait "$pid" || failed_runs=$((failed_runs + 1))
done
status=0
[ "$failed_runs" -eq 0 ] || status=1
for tool in "${tools[@]}"; do
    logs=("$OUT/$tool".*.log)
    outs=("$OUT/$tool".*.out)
    if [ "$tool" = racecheck ]; then  # "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)"
        errors=$(grep -ho "([0-9]* errors" "${logs[@]}" | tr -dc '0-9\n' | awk '{s += $1} END {print s + 0}')
        reports=$(grep -hc "RACECHECK SUMMARY" "${logs[@]}" | awk '{s += $1} END {print s + 0}')
    else  # "ERROR SUMMARY: N errors"
        errors=$(grep -hoE "ERROR SUMMARY: [0-9]+ errors?$" "${logs[@]}" | tr -dc '0-9\n' | awk '{s += $1} END {print s + 0}')
        reports=$(grep -hcE "ERROR SUMMARY: [0-9]+ errors?$" "${logs[@]}" | awk '{s += $1} END {print s + 0}')
    fi
    leaks=""
    if [ "$tool" = memcheck ]; then  # "LEAK SUMMARY: B bytes leaked in A allocations", where any leaked
        leaked=$(grep -ho "LEAK SUMMARY: [0-9]* bytes" "${logs[@]}" | tr -dc '0-9\n' | awk '{s += $1} END {print s + 0}')
        leaks=", $leaked bytes leaked"
        [ "$leaked" -eq 0 ] || status=1
    fi
    passed=$(grep -hoE "^[0-9]+ passed" "${outs[@]}" | awk '{s += $1} END {print s + 0}')
    failed=$(grep -hoE "[0-9]+ failed" "${outs[@]}" | awk '{s += $1} END {print s + 0}')
    finished=$(grep -hcE "^[0-9]+ passed, [0-9]+ failed" "${outs[@]}" | awk '{s += $1} END {print s + 0}')
    printf '%-10s %d errors%s (%d of %d reports) | conformance: %d passed, %d failed (%d of %d shards finished)\n' \
        "$tool" "$errors" "$leaks" "$reports" "${#logs[@]}" "$passed" "$failed" "$finished" "${#outs[@]}"
    if [ "$errors" -ne 0 ] || [ "$reports" -ne "${#logs[@]}" ] || [ "$failed" -ne 0 ] || [ "$finished" -ne "${#outs[@]}" ]; then
        status=1
    fi
done
echo "sanitize: $(( $(date +%s) - start )) s, $([ $status -eq 0 ] && echo clean || echo NOT clean)"
exit $status
