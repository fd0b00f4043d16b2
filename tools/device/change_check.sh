#!/usr/bin/env bash
# After a kernel change, in one call: build (sm_90) the test programs of the steps it
# touches, and the C interface's; run their GPU tests, and compute-sanitizer's three tools
# on each step's, all side by side (the tools are CPU-bound and the tests only check
# results, so they may share the GPU); the SASS facts of those steps. Timing comes after,
# on a quiet GPU: tools/device/ab.sh, run by the caller on the same build folder.
#   STEPS="07 08" [PHASE=test|sanitize|all] [LIMIT=480] bash tools/device/change_check.sh [build-dir]
# (test: the build, the tests and the SASS; sanitize: the sanitizers, on test's build — so
#  that a bench can run between the two on a quiet GPU; LIMIT: the seconds each test
#  program and each sanitizer may run before it is killed)
# Results (test0X.txt, testcapi.txt, sass0X.txt, device.txt) into $OUT/results.tgz (and
# $RESULTS, if given: ab.sh takes it too), to be unpacked into notes/results/h200; logs
# into $OUT/logs.tgz (and $LOGS). FA_COMMIT: the commit to record (the machine's copy of
# the tree may not carry its history).
set -uo pipefail
source "$(dirname "$0")/start.sh"     # device_start, stamp, build90
source "$(dirname "$0")/sanitize.sh"  # sanitize, sanitizer_lines, sass_counts
STEPS=${STEPS:-07 08}; LIMIT=${LIMIT:-480}; PHASE=${PHASE:-all}
device_start "${1:-build-gpu}" device.txt
# What each step's tests demand of the GPU (not to be skipped on it), and what its SASS should show.
declare -A demand=([06]="--gpu-min-sm 80" [07]="--gpu-min-sm 90 --gpu-exact-sm" [08]="--gpu-min-sm 80")
declare -A opcodes=([06]="HMMA LDGSTS LDL|STL" [07]="HGMMA UTMALDG UTMASTG LDL|STL" [08]="HMMA LDGSTS LDL|STL")
gpu_tests() {  # gpu_tests NAME EXE ARGS...: EXE's GPU tests into $L/test-NAME.log, and a line
  local name=$1 exe=$2; shift 2
  timeout "$LIMIT" "$exe" --gpu "$@" "[gpu]" >"$L/test-$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc: $(tail -2 "$L/test-$name.log" | tr '\n' ' ')"
  [ $rc -ne 0 ] && grep -B4 -A25 "FAILED" "$L/test-$name.log" | head -80
  return $rc
}
if [ "$PHASE" != sanitize ]; then
  targets="capi_tests fa_capi fa_bench"; for n in $STEPS; do targets+=" step${n}_tests"; done
  build90 $targets || exit 1
  for n in $STEPS; do
    { echo "SASS of step $n's kernels (cuobjdump --dump-sass), per kernel: ${opcodes[$n]}"
      sass_counts "$(echo "$BUILD"/steps/${n}_*/libstep${n}.a)" ${opcodes[$n]}; } > "$R/sass$n.txt" 2>&1
    tail -n +2 "$R/sass$n.txt" | grep -v " 0 LDL/STL" | head -5  # a kernel that spills
    gpu_tests step$n "$(echo "$BUILD"/steps/${n}_*/step${n}_tests)" ${demand[$n]} &
  done
  gpu_tests capi "$BUILD/tests/capi_tests" &
  wait
  stamp tested
fi
if [ "$PHASE" != test ]; then
  for n in $STEPS; do sanitize step$n "$(echo "$BUILD"/steps/${n}_*/step${n}_tests)" "$L" "$LIMIT" & done
  wait
  stamp sanitized
fi
for n in $STEPS; do
  { echo "step${n}_tests --gpu \"[gpu]\": $(grep -m1 -E 'All tests passed|test cases' "$L/test-step$n.log")"
    [ "$PHASE" != test ] && sanitizer_lines step$n "$L"; } > "$R/test$n.txt"
  cat "$R/test$n.txt"
done
echo "capi_tests --gpu \"[gpu]\": $(grep -m1 -E 'All tests passed|test cases' "$L/test-capi.log")" | tee "$R/testcapi.txt"
# Nonzero unless every line says all tests passed and every sanitizer summary is 0.
grep -hv "All tests passed" "$R"/test*.txt | grep -q . && exit 1
grep -hqE "SUMMARY: [1-9]" "$R"/test*.txt && exit 1
exit 0
