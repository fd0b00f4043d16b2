#!/usr/bin/env bash
# The sm_80 code path, run for real on a newer GPU (the H200): a build of
# `80-virtual` holds PTX only, which the driver JIT-compiles at load time with
# __CUDA_ARCH__ = 800 — the code an A100 or an RTX 3090/4090 runs (steps 06 and 08; step 06 with dQ
# added by two scalar atomics instead of Hopper's vector one). The test runner
# prints "device code compiled for: sm_80" as the proof. Logs go to $OUT.
#
#   bash tools/device/sm80_check.sh [build-dir]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-logs}; BUILD=${1:-build-sm80}
mkdir -p "$OUT"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=80-virtual >/dev/null || exit 1
cmake --build "$BUILD" -j16 --target step06_tests step08_tests cli_tests common_tests flashattn >"$OUT/build-sm80.log" 2>&1 \
  || { grep -A5 error "$OUT/build-sm80.log" | head -40; exit 1; }
stamp "built (80-virtual)"
cuobjdump --list-ptx --list-elf "$BUILD"/steps/06_tensor_cores/libstep06.a 2>&1 | sort | uniq -c | sed 's/^/  /' | head -8
# The JIT cache would hide the compile time of a first run; keep it, but in $BUILD.
export CUDA_CACHE_PATH=$PWD/$BUILD/jit-cache CUDA_CACHE_MAXSIZE=4294967296
(cd "$BUILD" && ctest -V -R "^(step06|step08|cli|common) gpu$") >"$OUT/ctest-sm80.log" 2>&1
rc=$?
grep -E "device code compiled|tests passed|Failed|Not Run|Passed" "$OUT/ctest-sm80.log"
[ $rc -ne 0 ] && grep -B2 -A30 "FAILED:" "$OUT/ctest-sm80.log" | head -80
stamp "tested (rc=$rc)"
exit $rc
