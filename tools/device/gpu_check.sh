#!/usr/bin/env bash
# The one command for a GPU machine: configure and build for sm_90, run every test
# (GPU tests included), compute-sanitizer (memcheck, racecheck, synccheck) on the
# GPU tests at quick sizes, and the tour. Logs go to $OUT (default ./gpu-logs).
#
#   bash tools/device/gpu_check.sh [build-dir]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-logs}
BUILD=${1:-build-gpu}
mkdir -p "$OUT"
step() { echo "== $(date +%T) $*"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/device.txt"
nvcc --version | tail -2 | tee -a "$OUT/device.txt"

step "configure + build"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DFA_PTXAS_VERBOSE=ON >"$OUT/configure.log" 2>&1 \
  || { tail -40 "$OUT/configure.log"; exit 1; }
cmake --build "$BUILD" -j16 -- -k 0 >"$OUT/build.log" 2>&1 || { grep -B2 -A6 -E "error" "$OUT/build.log" | head -80; exit 1; }
grep -E "warning" "$OUT/build.log" | sort -u | head -20
grep -E "ptxas info    : (Used|Compiling)|spill" "$OUT/build.log" > "$OUT/ptxas.txt"
grep -E "bytes stack frame" "$OUT/build.log" | sort | uniq -c | sort -rn | head -5

step "ctest"
(cd "$BUILD" && ctest -j4 --output-on-failure --timeout 900) >"$OUT/ctest.log" 2>&1
rc=$?
grep -E "tests passed|tests failed|Not Run|Skipped|\*\*\*Failed|Passed" "$OUT/ctest.log"
[ $rc -ne 0 ] && grep -B5 -A40 -E "FAILED:" "$OUT/ctest.log" | head -150

step "compute-sanitizer (FA_TEST_QUICK=1; racecheck FA_TEST_QUICK=2)"
export OUT
# All (tool, executable) pairs at once: the sanitizers are CPU-bound, the machine has 16 cores.
sanitize() {
  tool=$1 exe=$2 name=$(basename "$2")
  start=$SECONDS
  quick=1
  [ "$tool" = racecheck ] && quick=2
  FA_TEST_QUICK=$quick timeout 400 compute-sanitizer --tool "$tool" --error-exitcode 9 "$exe" --gpu "[gpu]" >"$OUT/san-$tool-$name.log" 2>&1
  src=$?
  summary=$(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|All tests passed|test cases:" "$OUT/san-$tool-$name.log" | tr '\n' ' ')
  echo "$tool $name rc=$src $((SECONDS - start))s $summary"
}
export -f sanitize
for tool in memcheck racecheck synccheck; do
  for exe in "$BUILD"/tests/common_tests "$BUILD"/tests/cli_tests "$BUILD"/steps/*/step*_tests; do echo "$tool $exe"; done
done | xargs -P 18 -L 1 bash -c 'sanitize "$0" "$1"' | sort | tee "$OUT/sanitizer-summary.txt"
( cd "$OUT" && tar czf sanitizer-logs.tar.gz san-*.log && rm -f san-*.log )

step "tour"
"$BUILD"/tools/flashattn/flashattn | tee "$OUT/tour.txt"
"$BUILD"/tools/flashattn/flashattn --N 4096 --H 8 > "$OUT/tour-4k.txt" 2>&1; tail -12 "$OUT/tour-4k.txt"
step "done (ctest rc=$rc)"
exit $rc
