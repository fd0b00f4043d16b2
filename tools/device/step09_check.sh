#!/usr/bin/env bash
# Step 09 on the one-GPU machine in one call: build (sm_90), step 09's GPU tests (the
# ring of R ranks on one GPU against step 06's kernel, the model and the budget) and
# compute-sanitizer (memcheck, racecheck, synccheck) on them.
#   bash tools/device/step09_check.sh [build-dir]
# Results (test09.txt, device09.txt) into $OUT/results.tgz, to be unpacked into
# notes/results/h200; logs into $OUT/logs.tgz.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-logs}; BUILD=${1:-build-gpu}; R=$(mktemp -d); L=$(mktemp -d)
trap 'tar -czf "$OUT/logs.tgz" -C "$L" . 2>/dev/null; tar -czf "$OUT/results.tgz" -C "$R" . 2>/dev/null' EXIT
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; } > "$R/device09.txt"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null || exit 1
cmake --build "$BUILD" -j16 --target step09_tests >"$L/build.log" 2>&1 ||
  { grep -B2 -A8 -E "error|FAILED" "$L/build.log" | head -60; exit 1; }
stamp built
exe=$BUILD/steps/09_ring/step09_tests
timeout ${TEST_TIMEOUT:-200} "$exe" --gpu --gpu-min-sm 80 "[gpu]" >"$L/test09.log" 2>&1; rc=$?
tail -3 "$L/test09.log"; [ $rc -ne 0 ] && grep -B4 -A25 "FAILED" "$L/test09.log" | head -120
stamp tested
if [ $rc -eq 0 ]; then
  for tool in memcheck racecheck synccheck; do
    ( q=1; [ $tool = racecheck ] && q=2
      FA_TEST_QUICK=$q timeout ${SAN_TIMEOUT:-200} compute-sanitizer --tool $tool --error-exitcode 9 "$exe" --gpu "[gpu]" \
        >"$L/san-$tool-step09.log" 2>&1
      echo "$tool step09 rc=$? $(grep -hE 'SUMMARY|passed|failed' "$L/san-$tool-step09.log" | tr '\n' ' ')" ) &
  done
  wait
  { echo "step09_tests --gpu \"[gpu]\": $(grep -m1 'All tests passed' "$L/test09.log")"
    for tool in memcheck racecheck synccheck; do
      echo "compute-sanitizer --tool $tool (FA_TEST_QUICK): $(grep -h 'All tests passed' "$L/san-$tool-step09.log" | head -1); $(grep -h SUMMARY "$L/san-$tool-step09.log" | sed 's/=* *//')"
    done; } > "$R/test09.txt"; cat "$R/test09.txt"
  stamp sanitized
fi
exit $rc
