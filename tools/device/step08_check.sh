#!/usr/bin/env bash
# Step 08 on the GPU machine in one call: build (sm_90), the GPU tests of steps 08 and
# 06 (whose forward step 08 is measured against) and of the CLI, compute-sanitizer
# (memcheck, racecheck, synccheck) on step 08, the SASS facts, and the decoding bench:
# step 08 (and its versions: fixed split counts, 08r2, note 08's lesson rows) beside step 06
# and PyTorch's backends, with the GPU's copy bandwidth.
#   [PHASE=test|all|final] bash tools/device/step08_check.sh [build-dir]
# (final: the whole build and the whole ctest — every step's GPU tests — instead of the
#  three test programs, then the sanitizers and the bench as in `all`)
# Results (bench08*.csv, peers08*.csv, sass08.txt, test08.txt, ctest08.txt, device08.txt)
# into $OUT/results.tgz, to be unpacked into notes/results/h200; logs into $OUT/logs.tgz.
set -uo pipefail
source "$(dirname "$0")/start.sh"     # device_start, stamp, build90
source "$(dirname "$0")/sanitize.sh"  # sanitize, sanitizer_lines, sass_counts
PHASE=${PHASE:-all}
device_start "${1:-build-gpu}" device08.txt
targets="step08_tests step06_tests cli_tests flashattn fa_bench"; [ "$PHASE" = final ] && targets=
build90 $targets || exit 1
exe=$BUILD/steps/08_split_kv/step08_tests
{ echo "SASS of step 08's kernels (cuobjdump --dump-sass), per kernel: tensor-core MMAs, cp.async (LDGSTS), local memory"
  sass_counts "$BUILD"/steps/08_split_kv/libstep08.a HMMA LDGSTS 'LDL|STL'
} > "$R/sass08.txt" 2>&1; cat "$R/sass08.txt"
rc=0
if [ "$PHASE" = final ]; then
  # The whole suite; step 08's assertion count from its part of the verbose log.
  (cd "$BUILD" && ctest -j4 -V) >"$L/ctest.log" 2>&1; rc=$?
  n=$(grep -oE "Test +#[0-9]+: step08 gpu" "$L/ctest.log" | grep -oE "[0-9]+" | head -1)
  { grep -m1 -E "^[0-9]+% tests passed" "$L/ctest.log"  # then every test's line, by number
    grep -E "Test +#[0-9]+: .*(Passed|Failed|Not Run|\*\*\*)" "$L/ctest.log" | sed -E 's/^ *[0-9]+\/[0-9]+ //; s/ +/ /g; s/^ //' |
      sort -t'#' -k2 -n
  } > "$R/ctest08.txt"; cat "$R/ctest08.txt"
  grep -E "^$n: (All tests passed|test cases)" "$L/ctest.log" | sed "s/^$n: //" > "$L/test-step08.log"
  [ $rc -ne 0 ] && grep -B4 -A25 "FAILED" "$L/ctest.log" | head -120
fi
for n in ${TEST_STEPS:-08 06}; do  # TEST_STEPS=08: step 08 alone
  [ "$PHASE" = final ] && break
  t=step$n
  timeout 300 "$BUILD"/steps/${n}_*/${t}_tests --gpu --gpu-min-sm 80 "[gpu]" >"$L/test-$t.log" 2>&1; r=$?
  echo "$t rc=$r: $(tail -2 "$L/test-$t.log" | tr '\n' ' ')"; [ $r -ne 0 ] && { rc=$r; grep -B4 -A25 "FAILED" "$L/test-$t.log" | head -120; }
done
if [ "$PHASE" != final ]; then
  timeout 120 "$BUILD/tests/cli_tests" --gpu "[gpu]" >"$L/test-cli.log" 2>&1; r=$?
  echo "cli rc=$r: $(tail -2 "$L/test-cli.log" | tr '\n' ' ')"; [ $r -ne 0 ] && { rc=$r; grep -B4 -A25 "FAILED" "$L/test-cli.log" | head -60; }
fi
stamp tested
sanitize step08 "$exe" "$L" 300
{ echo "step08_tests --gpu \"[gpu]\": $(grep -m1 -E 'All tests passed|test cases' "$L/test-step08.log")"
  [ "$PHASE" != final ] && echo "step06_tests --gpu \"[gpu]\": $(grep -m1 -E 'All tests passed|test cases' "$L/test-step06.log")"
  [ "$PHASE" != final ] && echo "cli_tests --gpu \"[gpu]\": $(grep -m1 -E 'All tests passed|test cases' "$L/test-cli.log")"
  sanitizer_lines step08 "$L"; } > "$R/test08.txt"
cat "$R/test08.txt"
stamp sanitized
[ "$PHASE" = test ] && exit $rc
[ $rc -ne 0 ] && exit $rc
# The decoding bench: the issue's shapes (d = 128, N_q = 1 and 16, N_kv = 8k–128k, B·H = 32
# and 128; causal for N_q = 16), and grouped-query attention (8 query heads a K/V head).
SHAPES="--d 128 --Nq 1,16 --Nkv 8192,16384,32768,65536,131072 --bh 32,128"
"$BUILD/tools/bench/fa_bench" --decode --steps 06,08 --versions $SHAPES --group 1 --causal 0,1 --reps 20 \
  --csv "$R/bench08.csv" 2> "$L/bench08.log"; tail -1 "$L/bench08.log"
"$BUILD/tools/bench/fa_bench" --decode --steps 06,08 $SHAPES --group 8 --causal 0 --Nq 1 --reps 20 \
  --csv "$R/bench08_gqa.csv" 2> "$L/bench08_gqa.log"; tail -1 "$L/bench08_gqa.log"
stamp "benched step 08"
python3 tools/bench/peers_decode.py $SHAPES --group 1 --causal 0,1 --reps 20 --csv "$R/peers08.csv" 2> "$L/peers08.log"
python3 tools/bench/peers_decode.py $SHAPES --group 8 --causal 0 --Nq 1 --reps 20 --csv "$R/peers08_gqa.csv" \
  2> "$L/peers08_gqa.log"; tail -2 "$L/peers08_gqa.log"
stamp "benched PyTorch"
exit $rc
