#!/usr/bin/env bash
# Where the warps of step 06's d = 128 dK/dV kernels wait, per SASS instruction:
# Nsight Compute's source counters (warp-state samples per instruction) for every launch
# of FlashAttention-2's warp layouts in `fa_bench --once --versions`: production's
# dkdv_shared_kernel first, then version_shared_kernel of the versions from b8 on, in
# table order; bf16, not causal.
#   OUT=logs bash tools/device/ncu_source.sh [build-dir] [N]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-logs}; BUILD=${1:-build-gpu}; N=${2:-16384}
mkdir -p "$OUT"
ncu --clock-control none --kernel-name regex:'(dkdv|version)_shared' --section SourceCounters --section WarpStateStats \
  -f -o "$OUT/source06" "$BUILD/tools/bench/fa_bench" --dtype bf16 --once --versions --steps 06 --dir bwd \
  --N "$N" --d 128 --causal 0 >"$OUT/source06_run.log" 2>&1 || { tail -5 "$OUT/source06_run.log"; exit 1; }
grep '^once' "$OUT/source06_run.log" >"$OUT/source06_launches.txt"
ncu --import "$OUT/source06.ncu-rep" --page source --print-source sass --csv >"$OUT/source06.csv" 2>"$OUT/source06.err" ||
  ncu --import "$OUT/source06.ncu-rep" --page source --csv >"$OUT/source06.csv" 2>>"$OUT/source06.err"
ncu --import "$OUT/source06.ncu-rep" --page details --csv >"$OUT/source06_details.csv" 2>>"$OUT/source06.err"
echo "ncu_source: $(wc -l <"$OUT/source06.csv") source rows, $(wc -l <"$OUT/source06_details.csv") detail rows"
