#!/usr/bin/env bash
# The lecture's two headline claims, measured side by side in one run: FlashAttention
# is several times faster than standard attention, and its extra memory grows
# linearly in N. "Standard attention" is PyTorch's `math` backend (the GEMMs, with S
# and P in device memory) and our own step 01; the fused steps are 02-05 (fp32) and
# 06 (bf16, against `math` in bf16).
#   bash tools/bench/claims.sh notes/results/h200 [build-gpu]
# then: python3 tools/bench/update_docs.py notes/results/h200 (table "claims"), and
# python3 tools/bench/plot.py --dir notes/results/h200 (speedup_vs_n.png, claims_memory.png).
set -uo pipefail
dest=${1:?results folder}; BUILD=${2:-build-gpu}
mkdir -p "$dest"
N=1024,2048,4096,8192,16384
# Speed: B·H·N = 65536 at every N, d = 64, not causal, forward and backward.
"$BUILD/tools/bench/fa_bench" --steps 01,02,03,04,05 --d 64 --causal 0 --dir fwd,bwd --N $N --reps 5 \
  --csv "$dest/claims.csv" 2> "$dest/claims.log"; tail -1 "$dest/claims.log"
"$BUILD/tools/bench/fa_bench" --dtype bf16 --steps 06 --d 64 --causal 0 --dir fwd,bwd --N $N --reps 10 \
  --csv "$dest/claims06.csv" 2>> "$dest/claims.log"; tail -1 "$dest/claims.log"
python3 tools/bench/peers.py --backends math --dtypes fp32,bf16 --d 64 --causal 0 --dir fwd,bwd --N $N --reps 5 \
  --csv "$dest/claims_peers.csv" 2> "$dest/claims_peers.log"; tail -1 "$dest/claims_peers.log"
# Memory: one head (B = H = 1), N as far as standard attention goes; extra device memory
# beside the inputs and outputs (fa_bench's workspace; PyTorch's allocator peak).
M=1024,2048,4096,8192,16384,32768,65536,131072
"$BUILD/tools/bench/fa_bench" --steps 01,04,05 --d 64 --causal 0 --dir fwd,bwd --N $M --tokens 1 --reps 1 \
  --csv "$dest/claims_memory.csv" 2> "$dest/claims_memory.log"; tail -1 "$dest/claims_memory.log"
"$BUILD/tools/bench/fa_bench" --dtype bf16 --steps 06 --d 64 --causal 0 --dir fwd,bwd --N $M --tokens 1 --reps 1 \
  --csv "$dest/claims_memory06.csv" 2>> "$dest/claims_memory.log"; tail -1 "$dest/claims_memory.log"
python3 tools/bench/peers.py --backends math --dtypes fp32,bf16 --d 64 --causal 0 --dir fwd,bwd --N $M --tokens 1 \
  --reps 1 --csv "$dest/claims_memory_peers.csv" 2> "$dest/claims_memory_peers.log"; tail -1 "$dest/claims_memory_peers.log"
