#!/usr/bin/env bash
# The training comparison of python/examples: SDPA under four data orders (the band), then
# each step with the first order; bf16 at the main size, fp32 at a small one (step 05 computes
# in fp32 on CUDA cores). Then the verdicts and the plot.
#
#   FLASHATTN_STEPS_LIB=build/tools/bench/libfa_capi.so bash python/examples/train_all.sh OUT_DIR
# ITERS and SMALL_ITERS (1500, 800): the iterations of the two sizes.
set -euo pipefail
out=${1:?usage: train_all.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
runs="$out/train_runs.csv"
rm -f "$runs"
train() { python3 "$here/train_gpt.py" --out "$runs" "$@"; }
big=(--iters "${ITERS:-1500}")
# bf16: 4 layers, width 256, 4 heads of d = 64, context 256 (about 3.3 M parameters)
for seed in 1 2 3 4; do train "${big[@]}" --attention sdpa --data-seed "$seed" --label "sdpa-$seed"; done
for step in 06 07; do train "${big[@]}" --attention "$step" --data-seed 1; done
# fp32, small: 2 layers, width 128, 2 heads of d = 64, context 128
small=(--dtype fp32 --layers 2 --width 128 --heads 2 --context 128 --iters "${SMALL_ITERS:-800}")
for seed in 1 2 3 4; do train "${small[@]}" --attention sdpa --data-seed "$seed" --label "sdpa-$seed"; done
train "${small[@]}" --attention 05 --data-seed 1
python3 "$here/curves.py" "$runs" --plot "$out/train_curves.png" --summary "$out/train_summary.csv" \
  | tee "$out/train_summary.md"
