#!/usr/bin/env bash
# Step 09 on the GPU machine in one call: build (sm_90), step 09's GPU tests (the ring of
# R ranks on one GPU against step 06's kernel, the model and the budget),
# compute-sanitizer (memcheck, racecheck, synccheck) on them, then — where NCCL was
# found — the ring over NCCL through ring09 (CTest's "step09 nccl R=…": Not Run with
# fewer GPUs than ranks) and its bench at every R this machine has GPUs for (1, 2, 4).
#   bash tools/device/step09_check.sh [build-dir]
# Results (test09.txt, nccl09.txt, bench09_r*.csv, device09.txt) into $OUT/results.tgz,
# to be unpacked into notes/results/h200; logs into $OUT/logs.tgz.
set -uo pipefail
source "$(dirname "$0")/start.sh"     # device_start, stamp, configure90, build90
source "$(dirname "$0")/sanitize.sh"  # sanitize, sanitizer_lines
device_start "${1:-build-gpu}" device09.txt
configure90 || exit 1
grep -m1 "NCCL" "$L/cmake.log" | sed 's/^-- //' | tee -a "$R/device09.txt"
nccl=0; grep -q "^-- NCCL [0-9]" "$L/cmake.log" && nccl=1
targets="step09_tests"; [ $nccl = 1 ] && targets="$targets ring09 step09_nccl_tests step09_bench"
build90 $targets || exit 1
exe=$BUILD/steps/09_ring/step09_tests
timeout ${TEST_TIMEOUT:-200} "$exe" --gpu --gpu-min-sm 80 "[gpu]" >"$L/test09.log" 2>&1; rc=$?
tail -3 "$L/test09.log"; [ $rc -ne 0 ] && grep -B4 -A25 "FAILED" "$L/test09.log" | head -120
stamp tested
if [ $rc -eq 0 ]; then
  sanitize step09 "$exe" "$L" ${SAN_TIMEOUT:-200}
  { echo "step09_tests --gpu \"[gpu]\": $(grep -m1 'All tests passed' "$L/test09.log")"
    sanitizer_lines step09 "$L"; } > "$R/test09.txt"; cat "$R/test09.txt"
  stamp sanitized
fi
[ $rc -ne 0 ] || [ $nccl = 0 ] && exit $rc
(cd "$BUILD" && ctest -R "step09 nccl" --output-on-failure) >"$L/nccl09.log" 2>&1; rc=$?
{ grep -m1 "tests passed" "$L/nccl09.log"; grep -E "Test +#[0-9]+: step09 nccl" "$L/nccl09.log" | sed -E 's/ +/ /g; s/^ //'
  grep -h "All tests passed" "$L/nccl09.log" | sort | uniq -c; } > "$R/nccl09.txt"; cat "$R/nccl09.txt"
[ $rc -ne 0 ] && { grep -B3 -A30 "FAILED" "$L/nccl09.log" | head -80; exit $rc; }
stamp "nccl tested"
gpus=$(nvidia-smi -L | wc -l)
for ranks in 1 2 4; do
  [ $ranks -gt $gpus ] && break
  timeout ${BENCH_TIMEOUT:-200} "$BUILD/steps/09_ring/ring09" --ranks $ranks -- "$BUILD/steps/09_ring/step09_bench" \
    --N ${NS:-16384,65536} --d 128 --causal 0,1 --heads 8 --reps 10 --csv "$R/bench09_r$ranks.csv" > "$L/bench09_r$ranks.log" 2>&1
  echo "bench R=$ranks rc=$?"; grep "rank 0" "$L/bench09_r$ranks.log" | head -12
  stamp "benched R = $ranks"
done
exit 0
