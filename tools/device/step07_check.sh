#!/usr/bin/env bash
# Step 07 on the H200 in one call: build (sm_90; step 07 itself is sm_90a), its GPU
# tests, compute-sanitizer (memcheck, racecheck, synccheck), the SASS facts, and the
# forward beside step 06 and PyTorch's FlashAttention-2 and cuDNN backends.
#   [PHASE=test|short|fwd|bench|bwd|bwdbench|bwdprof|all|final] bash tools/device/step07_check.sh [build-dir]
# (test: the tests, sanitizers and SASS, then the short problems' table at d = 64;
#  short: that table alone; fwd: the forward's tables against the peers, no versions)
# (bwd: the tests and sanitizers, then the backward's bench instead of the forward's;
#  bwdbench, bwdprof: without the tests, the backward's tables against the peers, or its
#  versions, memory and profile — the two halves of bwd, each within one call's 10 minutes;
#  final: the whole build and ctest, and the GPU's bf16 GEMM rate)
# Results (bench07*.csv, peers07*.csv, versions07.csv, ncu07.csv, sass07.txt, device07.txt)
# into $OUT/results.tgz, to be unpacked into notes/results/h200; logs into $OUT/logs.tgz
# (only a few files come back from the machine).
set -uo pipefail
source "$(dirname "$0")/start.sh"     # device_start, stamp, build90
source "$(dirname "$0")/sanitize.sh"  # sanitize, sanitizer_lines, sass_counts
PHASE=${PHASE:-all}
device_start "${1:-build-gpu}" device07.txt
targets="step07_tests fa_bench flashattn"; [ "$PHASE" = final ] && targets=
build90 $targets || exit 1
exe=$BUILD/steps/07_hopper/step07_tests
rc=0
if [ "$PHASE" = final ]; then
  # The whole suite after the last kernel change: the summary line for note 07, and the
  # bf16 GEMM rate of this GPU for its scale.
  (cd "$BUILD" && ctest -j4 --output-on-failure) >"$L/ctest.log" 2>&1; rc=$?
  { grep -m1 "tests passed" "$L/ctest.log"; grep -E "Test +#[0-9]+: step07" "$L/ctest.log" | sed -E 's/ +/ /g; s/^ //'; } \
    > "$R/ctest07.txt"; cat "$R/ctest07.txt"
  python3 tools/bench/gemm_rate.py > "$R/gemm07.txt"
  cat "$R/gemm07.txt"; stamp final; exit $rc
fi
if [ "$PHASE" != bench ] && [ "$PHASE" != fwd ] && [ "$PHASE" != short ] && [ "$PHASE" != bwdbench ] && [ "$PHASE" != bwdprof ]; then
  { echo "SASS of step 07's kernels (cuobjdump --dump-sass), per kernel: wgmma, TMA loads/stores, local memory"
    sass_counts "$BUILD"/steps/07_hopper/libstep07.a HGMMA UTMALDG UTMASTG 'LDL|STL'
  } > "$R/sass07.txt" 2>&1; echo "$(grep -cE ": [1-9][0-9]* HGMMA" "$R/sass07.txt") kernels with wgmma"; grep -v " 0 LDL" "$R/sass07.txt" | head -5
  timeout ${TEST_TIMEOUT:-300} "$exe" --gpu --gpu-min-sm 90 --gpu-exact-sm "[gpu]" >"$L/test07.log" 2>&1; rc=$?
  tail -3 "$L/test07.log"; [ $rc -ne 0 ] && grep -B4 -A25 "FAILED" "$L/test07.log" | head -150
  stamp tested
  if [ $rc -eq 0 ]; then
    sanitize step07 "$exe" "$L" ${SAN_TIMEOUT:-300}
    { echo "step07_tests --gpu \"[gpu]\": $(grep -m1 'All tests passed' "$L/test07.log")"
      sanitizer_lines step07 "$L"; } > "$R/test07.txt"
    stamp sanitized
  fi
fi
[ $rc -ne 0 ] && exit $rc
if [ "$PHASE" = test ] || [ "$PHASE" = short ]; then
  # Short problems at d = 64 (note 07, "Short problems"): the lesson rows, the production
  # forward, which runs h1's kernel or h9's (two_blocks_an_sm), and cuDNN, one run.
  mkdir -p "$R/short07"; cp "$R/device07.txt" "$R/short07/"
  for tokens in 131072 524288; do
    "$BUILD/tools/bench/fa_bench" --steps 07 --versions --dtype bf16 --d 64 --N 1024,2048,4096,8192 --dir fwd \
      --tokens $tokens --reps 20 --csv "$R/short07/v64_t$tokens.csv" 2> "$L/short07_t$tokens.log"
    python3 tools/bench/peers.py --dtypes bf16 --d 64 --N 1024,2048,4096,8192 --dir fwd --backends cudnn \
      --tokens $tokens --reps 20 --csv "$R/short07/p64_t$tokens.csv" 2> "$L/short07_peers_t$tokens.log"
  done
  stamp "short problems"
  exit 0
fi
if [ "$PHASE" = bwd ] || [ "$PHASE" = bwdbench ] || [ "$PHASE" = bwdprof ]; then
  # The backward beside step 06, cuDNN and FlashAttention-2; the deterministic mode beside the default.
  NS=${NS:-1024,2048,4096,8192,16384,32768}
  [ "$PHASE" != bwdprof ] && for tokens in ${TOKENS:-131072 524288}; do
    "$BUILD/tools/bench/fa_bench" --steps 06,07 --dtype bf16 --d ${DS:-64,128,256} --N "$NS" --dir bwd --tokens $tokens \
      --reps 10 --csv "$R/bench07bwd_t$tokens.csv" 2> "$L/bench07bwd_t$tokens.log"; tail -1 "$L/bench07bwd_t$tokens.log"
    python3 tools/bench/peers.py --dtypes bf16 --d ${DS:-64,128,256} --N "$NS" --dir bwd --backends flash,cudnn \
      --tokens $tokens --reps 10 --csv "$R/peers07bwd_t$tokens.csv" 2> "$L/peers07bwd_t$tokens.log"
    tail -1 "$L/peers07bwd_t$tokens.log"; stamp "benched the backward at B·H·N = $tokens"
  done
  "$BUILD/tools/bench/fa_bench" --steps 07 --versions --dtype bf16 --d 64,128,256 --N 2048,8192 --dir bwd \
    --tokens 131072 --reps 10 --csv "$R/versions07bwd.csv" 2> "$L/versions07bwd.log"; tail -1 "$L/versions07bwd.log"
  if [ "$PHASE" != bwdprof ]; then
    python3 tools/bench/compare07.py "$R" --dir bwd > "$R/compare07bwd.txt"; tail -8 "$R/compare07bwd.txt"
  fi
  [ "$PHASE" = bwdbench ] && { stamp "backward benched"; exit 0; }
  # Extra device memory (the workspace) at N = 131072, B·H = 16, beside step 06's: one timed run each.
  "$BUILD/tools/bench/fa_bench" --steps 06,07 --dtype bf16 --d 64,128,256 --N 131072 --dir bwd --tokens 2097152 \
    --reps 1 --csv "$R/memory07bwd.csv" 2> "$L/memory07bwd.log"; tail -1 "$L/memory07bwd.log"
  # What the profiler shows of the backward's kernels (d = 64, 128, 256, N = 8192, B·H·N = 131072, not causal).
  timeout 200 ncu --clock-control none --csv --metrics gpu__time_duration.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,lts__t_sectors_op_red.sum,dram__bytes_read.sum \
    "$BUILD/tools/bench/fa_bench" --once --steps 07 --versions --dtype bf16 --d 64,128,256 --N 8192 --causal 0 --dir bwd \
    --tokens 131072 > "$R/ncu07bwd.csv" 2> "$L/ncu07bwd.log"; echo "ncu rc=$? $(grep -c gpu__time "$R/ncu07bwd.csv") kernels"
  stamp "backward benched"; exit 0
fi
NS=${NS:-1024,2048,4096,8192,16384,32768}
for tokens in ${TOKENS:-131072 524288}; do
  "$BUILD/tools/bench/fa_bench" --steps 06,07 --dtype bf16 --d 64,128,256 --N "$NS" --dir fwd --tokens $tokens \
    --reps 10 --csv "$R/bench07_t$tokens.csv" 2> "$L/bench07_t$tokens.log"; tail -1 "$L/bench07_t$tokens.log"
  python3 tools/bench/peers.py --dtypes bf16 --d 64,128,256 --N "$NS" --dir fwd --backends flash,cudnn \
    --tokens $tokens --reps 10 --csv "$R/peers07_t$tokens.csv" 2> "$L/peers07_t$tokens.log"; tail -1 "$L/peers07_t$tokens.log"
  stamp "benched B·H·N = $tokens"
done
python3 tools/bench/compare07.py "$R" > "$R/compare07.txt"; tail -14 "$R/compare07.txt"
[ "$PHASE" = fwd ] && { stamp "forward benched"; exit 0; }
# The lesson's rows: every version of note 07's table, two sizes, one run.
"$BUILD/tools/bench/fa_bench" --steps 07 --versions --dtype bf16 --d 64,128,256 --N 4096,16384 --dir fwd \
  --tokens 131072 --reps 10 --csv "$R/versions07.csv" 2> "$L/versions07.log"; tail -1 "$L/versions07.log"
stamp "versions"
# What the profiler shows per version (d = 64 and 128, N = 8192, B·H·N = 131072, not causal).
timeout 240 ncu --clock-control none --csv --metrics gpu__time_duration.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum,dram__bytes_read.sum,smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct \
  "$BUILD/tools/bench/fa_bench" --once --steps 07 --versions --dtype bf16 --d 64,128 --N 8192 --causal 0 --dir fwd \
  --tokens 131072 > "$R/ncu07.csv" 2> "$L/ncu07.log"; echo "ncu rc=$? $(grep -c gpu__time "$R/ncu07.csv") kernels"
stamp "profiled"
