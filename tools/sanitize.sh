#!/usr/bin/env bash
# The GPU conformance run under compute-sanitizer's memcheck (with --leak-check full), racecheck,
# initcheck and synccheck, the four at once, then one summary line each.
# Usage (repository root, on a machine with a CUDA device):
#   bash tools/sanitize.sh [conformance arguments, e.g. --op batch_matmul --schedule plain]
# Logs go to $OUT (default /tmp/sanitize): sanitize_<tool>.log (the sanitizer's report) and
# sanitize_<tool>.out (the conformance run's output). Exit status 0 when every tool reports
# 0 errors (and memcheck 0 leaked bytes) and every conformance run passed.
set -uo pipefail
OUT=${OUT:-/tmp/sanitize}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}
declare -A options=(
    [memcheck]="--leak-check full"
    [racecheck]="--racecheck-report all"
    [initcheck]=""
    [synccheck]=""
)
tools=(memcheck racecheck initcheck synccheck)
declare -A pids
start=$(date +%s)
for tool in "${tools[@]}"; do
    # shellcheck disable=SC2086
    compute-sanitizer --tool "$tool" ${options[$tool]} --print-limit 50 --log-file "$OUT/sanitize_$tool.log" \
        "$PYTHON" -m conformance --device gpu "$@" >"$OUT/sanitize_$tool.out" 2>&1 &
    pids[$tool]=$!
done
status=0
for tool in "${tools[@]}"; do
    wait "${pids[$tool]}"
    rc=$?
    summary=$(grep -h "ERROR SUMMARY" "$OUT/sanitize_$tool.log" | tail -1 | sed 's/^=* *//')
    leaks=$(grep -h "LEAK SUMMARY" "$OUT/sanitize_$tool.log" | tail -1 | sed 's/^=* *//')
    [ "$tool" = memcheck ] && [ -z "$leaks" ] && leaks="LEAK SUMMARY: 0 bytes leaked in 0 allocations"
    cases=$(grep -hE "^[0-9]+ passed, [0-9]+ failed" "$OUT/sanitize_$tool.out" | tail -1)
    printf '%-10s exit %-3s %-28s %-50s conformance: %s\n' "$tool" "$rc" "${summary:-no summary}" "$leaks" "${cases:-no summary}"
    if [ "$rc" -ne 0 ] || ! grep -q "ERROR SUMMARY: 0 errors" "$OUT/sanitize_$tool.log"; then
        status=1
    fi
    if [ "$tool" = memcheck ] && grep -q "LEAK SUMMARY" "$OUT/sanitize_$tool.log" \
        && ! grep -q "LEAK SUMMARY: 0 bytes leaked in 0 allocations" "$OUT/sanitize_$tool.log"; then
        status=1
    fi
done
echo "sanitize: $(( $(date +%s) - start )) s, $([ $status -eq 0 ] && echo clean || echo NOT clean)"
exit $status
