#!/usr/bin/env bash
# Step 08 and PyTorch's attention under Nsight Compute at decoding shapes: each kernel's
# launch (grid, block, registers, shared memory), time and DRAM bytes, at the state a
# timed call starts from (the L2 flushed by a write before it, --cache-control none).
#   SHAPES="bh:group:nq:nkv ..." [BACKENDS=cudnn,flash] [DETAIL=1] OUT=logs bash tools/device/ncu_decode.sh [build-dir]
# Writes $OUT/ncu_decode_<bh>_<group>_<nq>_<nkv>.csv, one per shape (step 08 and each backend).
# DETAIL=1: instead, the second launch of each attention kernel with the sections that say
# where its warps wait and what its memory does (SpeedOfLight, MemoryWorkloadAnalysis,
# WarpStateStats, SourceCounters), exported per shape and implementation as the details
# page (…_details.csv) and the SASS with its samples (…_sass.csv).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-logs}; BUILD=${1:-build-gpu}; BACKENDS=${BACKENDS:-cudnn,flash}; DETAIL=${DETAIL:-0}
SHAPES=${SHAPES:-"128:1:1:32768 128:1:1:131072 32:1:1:65536"}
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size
METRICS=$METRICS,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,launch__shared_mem_per_block_static
METRICS=$METRICS,launch__occupancy_limit_shared_mem,dram__throughput.avg.pct_of_peak_sustained_elapsed
mkdir -p "$OUT"
# profile NAME KERNEL_REGEX COMMAND...: into NAME.csv (metrics), or NAME.ncu-rep and its pages (DETAIL=1)
profile() {
  local name=$1 kernels=$2; shift 2
  if [ "$DETAIL" = 1 ]; then
    ncu --clock-control none -k regex:"$kernels" --launch-skip 1 --launch-count 1 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section SourceCounters -f -o "$name" "$@" \
      >"$name.log" 2>&1 || { tail -5 "$name.log"; return; }
    ncu --import "$name.ncu-rep" --page details --csv >"${name}_details.csv" 2>>"$name.log"
    ncu --import "$name.ncu-rep" --page source --print-source sass --csv >"${name}_sass.csv" 2>>"$name.log"
    rm -f "$name.ncu-rep"
  else
    ncu --clock-control none --cache-control none --csv -k regex:"$kernels" --metrics "$METRICS" "$@" >>"$name.csv" 2>&1
  fi
}
for s in $SHAPES; do
  IFS=: read -r bh group nq nkv <<<"$s"
  f="$OUT/ncu_decode_${bh}_${group}_${nq}_${nkv}"
  profile "$f$([ "$DETAIL" = 1 ] && echo _08)" 'split_kernel|combine_kernel' "$BUILD/tools/bench/fa_bench" --decode \
    --dtype bf16 --steps 08 --bh "$bh" --group "$group" --Nq "$nq" --Nkv "$nkv" --causal 0 --d 128 --reps 1
  # PyTorch: per backend one warm-up call and one more, each after a flush; only attention's kernels.
  for b in ${BACKENDS//,/ }; do
    profile "$f$([ "$DETAIL" = 1 ] && echo "_$b")" 'sdpa|flash|fmha|lean|attention' python3 - "$bh" "$group" "$nq" \
      "$nkv" "$b" <<'EOF'
import sys, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
bh, group, nq, nkv = (int(x) for x in sys.argv[1:5])
q = torch.rand(1, bh, nq, 128, device="cuda", dtype=torch.bfloat16)
k, v = (torch.rand(1, bh // group, nkv, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
flush = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
with sdpa_kernel(getattr(SDPBackend, {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION"}[sys.argv[5]])):
    for _ in range(2):
        flush.fill_(1)
        F.scaled_dot_product_attention(q, k, v, enable_gqa=group > 1)
torch.cuda.synchronize()
EOF
  done
  if [ "$DETAIL" = 1 ]; then echo "ncu_decode $s: $(ls "$f"_*_details.csv 2>/dev/null | wc -l) launches exported"
  else echo "ncu_decode $s: $(grep -c gpu__time_duration "$f.csv") kernel launches measured"; fi
done
