#!/usr/bin/env bash
# Step 06 beside PyTorch's FlashAttention-2 (and cuDNN) backends, forward and
# backward, bf16 (with the versions of the note's tables) and fp16 at d = 64, 128,
# and bf16 at d = 32, 96, 256: each pair of files comes from one fa_bench run and
# one peers.py run right after it.
#   bash tools/bench/step06_bench.sh notes/results/h200 [build-gpu]
set -uo pipefail
dest=${1:?results folder}; BUILD=${2:-build-gpu}
mkdir -p "$dest"
"$BUILD/tools/bench/fa_bench" --dtype bf16 --dir fwd,bwd --versions --csv "$dest/bench06.csv" --reps 10 \
  2> "$dest/bench06.log"; tail -1 "$dest/bench06.log"
python3 tools/bench/peers.py --dtypes bf16 --dir fwd,bwd --backends flash,cudnn --reps 10 --csv "$dest/peers06.csv" \
  2> "$dest/peers06.log"; tail -1 "$dest/peers06.log"
"$BUILD/tools/bench/fa_bench" --dtype fp16 --dir fwd,bwd --csv "$dest/bench06_fp16.csv" --reps 10 \
  2> "$dest/bench06_fp16.log"; tail -1 "$dest/bench06_fp16.log"
python3 tools/bench/peers.py --dtypes fp16 --dir fwd,bwd --backends flash --reps 10 --csv "$dest/peers06_fp16.csv" \
  2> "$dest/peers06_fp16.log"; tail -1 "$dest/peers06_fp16.log"
# The other head dimensions of the production kernels (no versions there), bf16, beside FA-2.
"$BUILD/tools/bench/fa_bench" --dtype bf16 --d 32,96,256 --dir fwd,bwd --csv "$dest/bench06_dims.csv" --reps 10 \
  2> "$dest/bench06_dims.log"; tail -1 "$dest/bench06_dims.log"
python3 tools/bench/peers.py --dtypes bf16 --d 32,96,256 --dir fwd,bwd --backends flash --reps 10 \
  --csv "$dest/peers06_dims.csv" 2> "$dest/peers06_dims.log"; tail -1 "$dest/peers06_dims.log"
