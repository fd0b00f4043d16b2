#!/usr/bin/env bash
# Step 06 on a GPU machine in one go: build, all tests, compute-sanitizer on the
# 16-bit path, the SASS facts, and step 06 beside PyTorch's bf16 backends.
#   bash tools/device/step06_check.sh [build-dir]     (results into notes/results/h200)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-logs}; BUILD=${1:-build-gpu}; R=notes/results/h200
mkdir -p "$OUT" "$R"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null || exit 1
cmake --build "$BUILD" -j16 >"$OUT/build.log" 2>&1 || { grep -A5 error "$OUT/build.log" | head -40; exit 1; }
(cd "$BUILD" && ctest -j4 --output-on-failure) >"$OUT/ctest.log" 2>&1; rc=$?
grep -E "tests passed|Failed|Not Run" "$OUT/ctest.log"; [ $rc -ne 0 ] && grep -B2 -A25 "FAILED:" "$OUT/ctest.log" | head -80
for job in "memcheck step06" "racecheck step06" "synccheck step06" "memcheck common" "memcheck cli"; do
  set -- $job
  exe=$(ls "$BUILD"/steps/*/"$2"_tests "$BUILD"/tests/"$2"_tests 2>/dev/null | head -1)
  ( q=1; [ "$1" = racecheck ] && q=2
    FA_TEST_QUICK=$q timeout 240 compute-sanitizer --tool "$1" --error-exitcode 9 "$exe" --gpu "[gpu]" >"$OUT/san-$1-$2.log" 2>&1
    echo "$1 $2 rc=$? $(grep -hE 'SUMMARY|passed|failed' "$OUT/san-$1-$2.log" | tr '\n' ' ')" ) &
done
wait
{ echo "ptxas (-Xptxas -v), step 06 kernels:"
  touch steps/06_tensor_cores/kernels.cu
  cmake --build "$BUILD" --target step06 2>&1 | grep -E "Compiling entry|Used|spill" | sed -E "s/.*_ZN2fa6step06[^ ]*forward_kernelI(6__half|13__nv_bfloat16)Li([0-9]+)E.*/forward_kernel<\1, d=\2>/; s/ptxas info +: //"
  echo "SASS instruction counts (cuobjdump --dump-sass):"
  cuobjdump --dump-sass "$BUILD"/steps/06_tensor_cores/libstep06.a | awk '/Function :/{f=$3} /HMMA/{h[f]++} /LDL|STL/{l[f]++} END{for(k in h) printf "%s: %d HMMA, %d local-memory loads/stores\n", k, h[k], l[k]+0}' | sed -E "s/_ZN2fa6step06[^ ]*forward_kernelI(6__half|13__nv_bfloat16)Li([0-9]+)E[^:]*/forward_kernel<\1, d=\2>/"
} > "$R/sass06.txt" 2>&1; cat "$R/sass06.txt"
"$BUILD"/tools/bench/fa_bench --dtype bf16 --dir fwd --csv "$R/bench06.csv" --reps 10 2>"$R/bench06.log"; tail -2 "$R/bench06.log"
python3 tools/bench/peers.py --dtypes bf16 --dir fwd --backends flash,cudnn --reps 10 --csv "$R/peers06.csv" 2>"$R/peers06.log"
exit $rc
