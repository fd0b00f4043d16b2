#!/usr/bin/env bash
# Step 06 on a GPU machine in one go: build, all tests, compute-sanitizer on the
# 16-bit paths, the ptxas/SASS facts, and step 06 beside PyTorch's backends.
#   [PHASE=test|bench] bash tools/device/step06_check.sh [build-dir]
# (results into notes/results/h200, logs into $OUT). PHASE=test: build, tests,
# sanitizers, ptxas/SASS; PHASE=bench: build, bench, profiler — each phase fits in
# one 10-minute device call (the build dir stays while the machine is warm); default: both.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-logs}; BUILD=${1:-build-gpu}; R=notes/results/h200; PHASE=${PHASE:-all}
mkdir -p "$OUT" "$R"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DFA_PTXAS_VERBOSE=ON >/dev/null || exit 1
cmake --build "$BUILD" -j16 >"$OUT/build.log" 2>&1 || { grep -A5 error "$OUT/build.log" | head -40; exit 1; }
stamp built
rc=0
if [ "$PHASE" != bench ]; then
  (cd "$BUILD" && ctest -j4 --output-on-failure) >"$OUT/ctest.log" 2>&1; rc=$?
  grep -E "tests passed|Failed|Not Run" "$OUT/ctest.log"; [ $rc -ne 0 ] && grep -B2 -A30 "FAILED:" "$OUT/ctest.log" | head -120
  stamp tested
  for job in "memcheck step06" "racecheck step06" "synccheck step06" "memcheck common" "memcheck cli"; do
    set -- $job
    exe=$(ls "$BUILD"/steps/*/"$2"_tests "$BUILD"/tests/"$2"_tests 2>/dev/null | head -1)
    ( q=1; [ "$1" = racecheck ] && q=2
      FA_TEST_QUICK=$q timeout 300 compute-sanitizer --tool "$1" --error-exitcode 9 "$exe" --gpu "[gpu]" >"$OUT/san-$1-$2.log" 2>&1
      echo "$1 $2 rc=$? $(grep -hE 'SUMMARY|passed|failed' "$OUT/san-$1-$2.log" | tr '\n' ' ')" ) &
  done
  wait
  stamp sanitized
  DEMANGLE=$(command -v c++filt || command -v cu++filt || echo cat)
  short() { "$DEMANGLE" | sed -E 's/fa::step06::\(anonymous namespace\):://; s/__nv_bfloat16/bf16/g; s/__half/fp16/g; s/\((int|unsigned long)[^)]*\)//'; }
  { echo "ptxas (-Xptxas -v), step 06 kernels (bf16; fp16 compiles to the same counts):"
    for f in forward backward; do  # both at once, printed in this order
      nvcc -std=c++20 -I. -DFA_HAVE_CUDA=1 -O3 -arch=sm_90 -Xptxas -v -c steps/06_tensor_cores/$f.cu -o /dev/null \
        >"$OUT/ptxas-$f.log" 2>&1 &
    done
    wait
    for f in forward backward; do
      awk -F"'" '/Compiling entry/{n=$2} /spill/{sub(/^ +/, ""); s=$0} /Used/{sub(/.*: +/, ""); print n ": " $0 "; " s}' \
        "$OUT/ptxas-$f.log" | short | grep -v fp16
    done
    echo "SASS instruction counts (cuobjdump --dump-sass):"
    cuobjdump --dump-sass "$BUILD"/steps/06_tensor_cores/libstep06.a |
      awk '/Function :/{f=$3; n=0} /\/\*[0-9a-f]+\*\//{n++} /HMMA/{h[f]++; if(!(f in a)) a[f]=n; z[f]=n}
           /LDL|STL/{l[f]++; pos[f]=pos[f] " " n}
           END{for(k in h) { w=""; if(l[k]) { m=split(pos[k], q, " "); inside=0
                 for(i=1;i<=m;i++) if(q[i]>a[k] && q[i]<z[k]) inside++
                 w=sprintf(" (%d of them between the first and the last HMMA)", inside) }
               printf "%s: %d HMMA, %d local-memory loads/stores%s\n", k, h[k], l[k]+0, w }}' |
      short | grep -v fp16 | sort
  } > "$R/sass06.txt" 2>&1; cat "$R/sass06.txt"
  stamp sass
fi
[ "$PHASE" = test ] && exit $rc
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$R/device.txt"
nvcc --version | tail -1 >> "$R/device.txt"
python3 -c "import torch; print('torch', torch.__version__)" >> "$R/device.txt" 2>&1
bash tools/bench/step06_bench.sh "$R" "$BUILD"
stamp benched
python3 tools/bench/ncu_step06.py --bench "$BUILD/tools/bench/fa_bench" --csv "$R/ncu06.csv" 2> "$R/ncu06.log"
tail -4 "$R/ncu06.log"
stamp profiled
exit $rc
