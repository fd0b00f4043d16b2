#!/usr/bin/env bash
# Step 06's short loop on a GPU machine, for trying a version before the full
# check (step06_check.sh): build two targets, run the step-06 GPU tests, time every
# version of the note's tables and PyTorch's FlashAttention-2 on the same shapes in
# one run, print each version's ratio, and keep the SASS for reading.
#   [SKIP_TESTS=1] OUT=logs bash tools/device/step06_quick.sh [build-dir] [--N … --d … --causal … --dir …]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-logs}; BUILD=${1:-build-gpu}; shift $(( $# > 0 ? 1 : 0 ))
mkdir -p "$OUT"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DFA_PTXAS_VERBOSE=ON >/dev/null || exit 1
cmake --build "$BUILD" -j16 --target step06_tests fa_bench >"$OUT/build.log" 2>&1 ||
  { grep -A5 error "$OUT/build.log" | head -40; exit 1; }
stamp built
if [ -z "${SKIP_TESTS:-}" ]; then  # SKIP_TESTS=1: timing only (the full check runs every test)
  "$BUILD/steps/06_tensor_cores/step06_tests" "[gpu]" >"$OUT/step06_tests.log" 2>&1
  echo "step06 [gpu] tests rc=$?: $(tail -2 "$OUT/step06_tests.log" | tr '\n' ' ')"
  stamp tested
fi
"$BUILD/tools/bench/fa_bench" --steps 06 --dtype bf16 --versions "$@" --reps 10 --csv "$OUT/quick06.csv" \
  2>"$OUT/quick06.log" || tail -3 "$OUT/quick06.log"
python3 tools/bench/peers.py --dtypes bf16 --backends flash --reps 10 "$@" --csv "$OUT/quick06_peers.csv" \
  2>"$OUT/quick06_peers.log" || tail -3 "$OUT/quick06_peers.log"
stamp benched
cuobjdump --dump-sass "$BUILD/steps/06_tensor_cores/libstep06.a" >"$OUT/sass06_full.txt" 2>&1
python3 - "$OUT/quick06.csv" "$OUT/quick06_peers.csv" <<'PY'
import csv, sys, collections
peer = {(r["dir"], r["N"], r["d"], r["causal"]): float(r["tflops"]) for r in csv.DictReader(open(sys.argv[2]))
        if r["impl"] == "torch-flash" and r["status"] == "ok"}
rows = collections.defaultdict(dict)
for r in csv.DictReader(open(sys.argv[1])):
    if r["status"] != "ok": continue
    k = (r["dir"], r["N"], r["d"], r["causal"])
    rows[r["step"]][k] = float(r["tflops"]) / peer[k] if k in peer else float("nan")
shapes = sorted({k for v in rows.values() for k in v}, key=lambda k: (k[0] != "fwd", int(k[2]), k[3], int(k[1])))
print("ratio to FA-2   " + " ".join(f"{k[0][0]}{k[2]}{'c' if k[3] == '1' else 'n'}{int(k[1]) // 1024}k" for k in shapes))
for step, v in rows.items():
    print(f"{step:15s} " + " ".join(f"{v[k]:7.2f}" if k in v else "      -" for k in shapes))
PY
stamp done
