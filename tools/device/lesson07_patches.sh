#!/usr/bin/env bash
# Note 07's backward rows b5, b7, b9 and b11 are whole backwards, kept as patches on the
# production one (notes/lab/patches/07_bwd_*.patch). One copy of the tree and one build: for
# each row the patch applied, step07_tests rebuilt (sm_90: only backward.cu compiles again),
# the backward's GPU tests run — production's and the deterministic mode's tests then hold the
# row to the budget, to the model and to itself — and the patch taken back.
#   bash tools/device/lesson07_patches.sh [ROW...]    (default: b5 b7 b9 b11)
# One line a row; each row's build and test logs into $OUT/logs.tgz (tools/device/start.sh).
set -uo pipefail
source "$(dirname "$0")/start.sh"  # device_start, stamp, build90
src=$(pwd)
tree=$(mktemp -d)
# The tree as it is, without its build folders and history.
tar -C "$src" --exclude='./build*' --exclude=./.git --exclude=./gpu-logs -cf - . | tar -C "$tree" -xf -
cd "$tree"
device_start "$tree/build" device07_patches.txt
rows=("$@"); [ ${#rows[@]} -eq 0 ] && rows=(b5 b7 b9 b11)
tests='*backward*,*deterministic*'  # Catch2: the test cases whose names say so
rc=0
for row in "${rows[@]}"; do
  patch="$src/notes/lab/patches/07_bwd_$row.patch"
  git apply "$patch" || { echo "$row: the patch does not apply"; rc=1; continue; }
  mkdir -p "$L/$row"
  if (L=$L/$row build90 step07_tests) >/dev/null 2>&1; then
    configured=1
    timeout ${TEST_TIMEOUT:-300} build/steps/07_hopper/step07_tests --gpu --gpu-min-sm 90 --gpu-exact-sm "$tests" \
      >"$L/test07_$row.log" 2>&1
    r=$?
    echo "$row: $(tail -1 "$L/test07_$row.log")"
    [ $r -ne 0 ] && { grep -B4 -A20 "FAILED" "$L/test07_$row.log" | head -60; rc=1; }
  else
    echo "$row: step07_tests does not build (log: $row/build.log)"; rc=1
  fi
  git apply -R "$patch" || { echo "$row: the patch does not come off"; exit 1; }
  stamp "$row"
done
exit $rc
