# Sourced first by the device scripts (step07/08/09_check.sh, change_check.sh, ab.sh): what
# each of them does before its own work, written once.
#   device_start BUILD-DIR FACTS-FILE
#       sets OUT (./gpu-logs unless given), BUILD, R (the results: $RESULTS if given) and L (the
#       logs: $LOGS if given), makes them, and packs R into $OUT/results.tgz and L into
#       $OUT/logs.tgz when the script exits, however it exits (only a few files come back from
#       the machine); writes the machine's facts (GPU, driver, nvcc, torch and cuDNN, the
#       commit: $FA_COMMIT, since the machine's copy of the tree may carry no history) into
#       R/FACTS-FILE unless a script before it in the same call did; starts stamp's clock.
#   stamp WORDS...
#       a line "[seconds since device_start] WORDS".
#   configure90
#       configures BUILD for sm_90 (Release, Ninja), CMake's lines into L/cmake.log (for a
#       script that reads them before it builds: step09_check.sh, for NCCL).
#   build90 [TARGET...]
#       configure90 unless the script has, then builds the TARGETs (every target, if none)
#       with 16 jobs, the log into L/build.log; on failure prints the errors and returns
#       non-zero.
device_start() {
  BUILD=$1
  OUT=${OUT:-$PWD/gpu-logs}; R=${RESULTS:-$(mktemp -d)}; L=${LOGS:-$(mktemp -d)}
  mkdir -p "$OUT" "$R" "$L"
  trap 'tar -czf "$OUT/logs.tgz" -C "$L" . 2>/dev/null; tar -czf "$OUT/results.tgz" -C "$R" . 2>/dev/null' EXIT
  [ -f "$R/$2" ] || { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nvcc --version | tail -1
    python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())" 2>&1
    echo "${FA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"; } > "$R/$2"
  t0=$(date +%s)
}

stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }

configure90() {
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DFA_PTXAS_VERBOSE=ON >"$L/cmake.log" 2>&1 ||
    { tail -20 "$L/cmake.log"; return 1; }
  configured=1
}

build90() {
  local targets=(); [ $# -gt 0 ] && targets=(--target "$@")
  [ -n "${configured:-}" ] || configure90 || return 1
  cmake --build "$BUILD" -j16 "${targets[@]}" >"$L/build.log" 2>&1 ||
    { grep -B2 -A8 -E "error|FAILED" "$L/build.log" | head -60; return 1; }
  stamp built
}
