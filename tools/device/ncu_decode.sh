#!/usr/bin/env bash
# Step 08 and PyTorch's attention under Nsight Compute at decoding shapes: each kernel's
# launch (grid, block, registers, shared memory), time and DRAM bytes, at the state a
# timed call starts from (the L2 flushed by a write before it, --cache-control none).
#   SHAPES="bh:group:nq:nkv ..." [BACKENDS=cudnn,flash] OUT=logs bash tools/device/ncu_decode.sh [build-dir]
# Writes $OUT/ncu_decode_<bh>_<group>_<nq>_<nkv>.csv, one per shape (step 08 and each backend).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-logs}; BUILD=${1:-build-gpu}; BACKENDS=${BACKENDS:-cudnn,flash}
SHAPES=${SHAPES:-"128:1:1:32768 128:1:1:131072 32:1:1:65536"}
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size
METRICS=$METRICS,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,launch__shared_mem_per_block_static
METRICS=$METRICS,launch__occupancy_limit_shared_mem,dram__throughput.avg.pct_of_peak_sustained_elapsed
mkdir -p "$OUT"
for s in $SHAPES; do
  IFS=: read -r bh group nq nkv <<<"$s"
  f="$OUT/ncu_decode_${bh}_${group}_${nq}_${nkv}.csv"
  ncu --clock-control none --cache-control none --csv -k regex:'split_kernel|combine_kernel' --metrics "$METRICS" \
    "$BUILD/tools/bench/fa_bench" --decode --dtype bf16 --steps 08 --bh "$bh" --group "$group" --Nq "$nq" \
    --Nkv "$nkv" --causal 0 --d 128 --reps 1 >"$f" 2>&1
  # PyTorch: one warm-up call and one profiled, after a flush; only attention's kernels.
  ncu --clock-control none --cache-control none --csv -k regex:'sdpa|flash|fmha|lean|attention' --launch-skip 0 \
    --metrics "$METRICS" python3 - "$bh" "$group" "$nq" "$nkv" "$BACKENDS" >>"$f" 2>&1 <<'EOF'
import sys, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
bh, group, nq, nkv = (int(x) for x in sys.argv[1:5])
q = torch.rand(1, bh, nq, 128, device="cuda", dtype=torch.bfloat16)
k, v = (torch.rand(1, bh // group, nkv, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
flush = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
for name in sys.argv[5].split(","):
    with sdpa_kernel(getattr(SDPBackend, {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION"}[name])):
        for _ in range(2):
            flush.fill_(1)
            F.scaled_dot_product_attention(q, k, v, enable_gqa=group > 1)
torch.cuda.synchronize()
EOF
  echo "ncu_decode $s: $(grep -c gpu__time_duration "$f") kernels"
done
