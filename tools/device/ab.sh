#!/usr/bin/env bash
# The steps beside PyTorch's attention in one process, on the same tensors, in alternation
# (tools/bench/ab.py over libfa_capi.so), on the H200 in one call.
#   [PHASE=fwd|bwd|bwdmain|bwdpeers|host|decode|floor|ring|stream|cluster|pause|gemm|short|h9|order|last|call|b9|b10|b11|b12|b16|det|all, or several: PHASE=short,decode] [ROUNDS=5]
#       bash tools/device/ab.sh [build-dir]
# gemm:   the bf16 matrix-product rate, timed the same way (also in fwd);
# fwd:    step 07's forward, step 06, cuDNN and FlashAttention-2, d = 64, 128, 256,
#         N = 1k–32k, causal and not, B·H·N = 131072 and 524288 (note 07's tables);
# bwd:    the same for the backward, with lesson rows b4 (07b4: K, V from shared memory at
#         d = 64), b5 (07b5: 64 queries a step at d = 128), b6 (07b6: 64 queries a step at
#         d = 64), b7 (07b7: b9's kernels in the call before b8), b8 (07b8: a block a tile) and
#         b9 (07b9: the stores fenced as soon as made), b10 (07b10: dQ's pieces in their own
#         step) and b11 (07b11: one writer of dQ's pieces) beside it;
# host:   step 07 and cuDNN's backward behind a spin of 200 µs and of 2000 µs, one after the
#         other (PyTorch's backward enqueues for longer than 200: ab.py's host_us_max; a
#         longer spin is also a longer rest for the GPU between repeats);
# decode: step 08 (and 08r4, a ring of four tiles at every shape, 08g1, the merge kernel
#         waiting for the whole split kernel, 08m2, the merge kernel wherever it splits,
#         08m1, that kernel launched late, and 08l0, no L2 hint on the K/V reads), step 06
#         and PyTorch's backends on note 08's decoding shapes;
# ring:   step 08 with a ring of six K/V tiles (08r6) beside production's four and PyTorch's
#         backends, on note 08's decoding shapes;
# stream: step 08 (the tiles shared by a wave of blocks where whole units' splits leave SMs
#         idle and blocks stream long) beside whole units' splits at every shape (08w1) and
#         PyTorch's cuDNN and FlashAttention-2 backends (the memory-efficient one, 2–9× slower
#         at every decoding shape in the runs before, is left out), on note 08's decoding shapes;
# cluster: step 08 (each unit's parts merged in a cluster of its blocks where it can be) beside
#         the merge kernel wherever it splits (08m2), cuDNN and FlashAttention-2, at the
#         shapes where the H200 merges in clusters (B·H = 15, 30, 39, 66; 15 K/V heads of 8);
# hint:   step 08 with its K/V reads without the L2 hint (08l0) and evict-first (08l1) at every
#         shape, beside production, cuDNN and FlashAttention-2, on note 08's decoding shapes;
# floor:  K and V read once with step 08's copy and nothing computed (tools/bench/read_floor.cu),
#         at the K/V sizes of note 08's decoding shapes: static cuts, chunks from a counter,
#         bulk copies (Hopper), fewer blocks, two an SM, and clusters (the clusters held at once
#         into clusters.txt);
# order:  production's causal tiles heaviest first across heads (measured at h10 and b14; since
#         h11, b15 the last section's order where a head has few tiles: PHASE=last) beside the
#         same kernels head after head — forward: h1 (d = 64's short
#         problems), h9 (d = 64, 128), h7 (d = 256); backward: b12, and the deterministic
#         mode —, and cuDNN, d = 64, 128, 256, N = 1k–32k, causal, both B·H·N;
# last:   the causal tiles heaviest first in the last section of heads only, head after head
#         before it (lesson rows h11, b15), beside every section heaviest first (h10, b14), the
#         production forward and backward (one or the other by a head's size), the same kernels
#         head after head (h1, h9, h7; b12), the deterministic mode and cuDNN, d = 64, 128, 256,
#         N = 1k–32k, causal, both B·H·N;
# short:  the forward's short problems at d = 128 (N = 1k–8k), where step 07 was below
#         cuDNN: lesson rows h1, h5 and s1 beside the production forward and cuDNN;
# h9:     the forward's persistent grid (lesson row h9, production at d = 64 and 128 but for
#         d = 64's short problems) beside a block a tile (h7) and cuDNN, d = 64, 128, 256 (H9_D),
#         N = 1k–32k, causal and not, both B·H·N;
# pause:  step 07 and cuDNN at d = 128 and 256 timed with no pause and after 500 ms of
#         rest before every block (note 07, "How far one run can be trusted");
# call:   the backward's fixed costs (lesson row b8): every kernel and memset of one call of
#         step 07, of its lesson row b7 (the call before b8) and of cuDNN, as the GPU ran them
#         (tools/bench/timeline.py), then the three timed at N = 1k–16k (CALL_IMPLS: other
#         implementations than 07,07b7,torch-cudnn);
# b9:     the backward's persistent grid (lesson row b9): step 07 beside b8 (07b8, a block a
#         tile) and cuDNN, d = 64, 128, 256, N = 1k–32k, causal and not, both B·H·N.
# b10:    the backward's stores fenced late (lesson row b10): step 07 beside b9 (07b9) and
#         cuDNN, d = 64 and 128 (the d = 256 kernel was b9's when b10 was measured; b10's fence move
#         reached it with b12), N = 1k–32k, causal and not, both B·H·N.
# b11:    a step's dQ pieces in the next step (lesson row b11): step 07 beside b10 (07b10), b9
#         and cuDNN, the shapes of b10.
# b12:    a writer of dQ's pieces per consumer at d = 128 (lesson row b12): step 07 beside b11
#         (07b11), the deterministic mode (07det) and cuDNN, d = 64, 128, 256, N = 1k–32k, causal
#         and not, both B·H·N.
# b16:    at d = 256 a step's second dQ piece staged in the next step (lesson row b16): step 07
#         beside the kernel before it with the same order of tiles (07b12 head after head, as
#         without the mask; with it 07b14 and 07b15, production's order at N >= 2048 and at 1024),
#         the deterministic mode and cuDNN, d = 256, N = 1k–32k, causal and not, both B·H·N.
# det:    the deterministic mode (07det) beside step 07 and cuDNN, d = 64, 128, 256, N = 1k–8k
#         (DET_N), causal and not, both B·H·N.
# bwdmain: the backward's main tables only (README, note 07): step 07, step 06, cuDNN and
#         FlashAttention-2, every shape (with fwd: both main tables);
# bwdpeers: the backward's production tables and its last lesson rows in one run: step 07 beside
#         b11, b10, b9, b8, step 06, cuDNN and FlashAttention-2, every shape (bwd without b4–b7).
# Results (ab*.csv, device.txt) into $OUT/results.tgz (and $RESULTS, if given), to be
# unpacked into notes/results/h200/ab; logs into $OUT/logs.tgz.
set -uo pipefail
source "$(dirname "$0")/start.sh"  # device_start, stamp, build90
PHASE=${PHASE:-all}; ROUNDS=${ROUNDS:-5}
device_start "${1:-build-gpu}" device.txt
build90 fa_capi fa_read_floor || exit 1
ab() { python3 tools/bench/ab.py --lib "$BUILD/tools/bench/libfa_capi.so" --rounds "$ROUNDS" --check-peers "$@"; }
run() {  # run NAME ARGS...: ab.py into $R/NAME.csv, its log into $L/NAME.log
  local name=$1; shift
  ab --csv "$R/$name.csv" "$@" 2> "$L/$name.log"; local rc=$?
  tail -2 "$L/$name.log"; [ $rc -ne 0 ] && tail -30 "$L/$name.log"; stamp "$name (rc $rc)"
}
want() { [[ ",$PHASE," == *",$1,"* || $PHASE == all ]]; }
if want fwd || want gemm; then
  # The bf16 matrix-product rate of this GPU now, timed as ab.py times (flush, spin, events): note 07's scale.
  python3 tools/bench/gemm_rate.py --spin-us 200 > "$R/gemm.txt"
  cat "$R/gemm.txt"
fi
want fwd && run ab07 --dir fwd --causal 0,1
want short && run ab07_short --dir fwd --impls 07,07h1,07h5,07s1,torch-cudnn --d 128 --N 1024,2048,4096,8192 --causal 0,1
want h9 && run ab07_h9 --dir fwd --impls 07h7,07h9,torch-cudnn --d "${H9_D:-64,128,256}" --causal 0,1
if want pause; then
  run ab07_pause0 --dir fwd --impls 07,torch-cudnn --d 128,256 --N 1024,4096,16384 --causal 0,1 --tokens 131072
  run ab07_pause500 --dir fwd --impls 07,torch-cudnn --d 128,256 --N 1024,4096,16384 --causal 0,1 --tokens 131072 \
    --pause-ms 500
fi
# Note 08's decoding shapes, in files NAME.csv (no mask), NAME_causal.csv (16 queries, the
# mask) and NAME_gqa.csv (8 query heads a K/V head): decode_runs NAME IMPLS.
decode_runs() {
  run "$1" --decode --causal 0 "$2"
  run "$1_causal" --decode --causal 1 --Nq 16 "$2"
  run "$1_gqa" --decode --causal 0 --Nq 1 --bh 32,128 --group 8 "$2"
}
# 08r4: a ring of four tiles at every shape; 08g1: the merge kernel (wherever it splits) waiting
# for the whole split kernel; 08m2: the merge kernel wherever it splits (no cluster's merge),
# launched early, its rows waiting for their parts; 08m1: launched after the splits, as any
# kernel; 08l0: K/V reads without the L2 hint at every shape
want decode && decode_runs ab08 --impls=08,08r4,08g1,08m2,08m1,08l0,06,torch-cudnn,torch-flash,torch-efficient
# The floor under them: K and V read once by step 08's copy, nothing computed, at the K/V
# sizes of those shapes (B·H_kv = 4, 16, 32, 128), in static cuts and in chunks from a counter
if want floor; then
  "$BUILD/tools/bench/fa_read_floor" > "$R/floor.csv" 2> "$R/clusters.txt"; stamp "floor (rc $?)"
fi
# 08w1: whole units' splits at every shape, where production shares the tiles in some
want stream && decode_runs ab08_stream --impls=08,08w1,torch-cudnn,torch-flash
# 08m2: the merge kernel wherever step 08 splits; production merges in clusters where every
# unit's chunks fit one and all the clusters fit at once — on the H200 15 units of 8 chunks,
# 30 of 4, 39 of 3, 66 of 2, not the decoding shapes above (note 08, "The merge in a cluster")
if want cluster; then
  impls=--impls=08,08m2,torch-cudnn,torch-flash
  run ab08_cluster --decode --causal 0 --bh 15,30,39,66 $impls
  run ab08_cluster_gqa --decode --causal 0 --Nq 1 --bh 120 --group 8 $impls
fi
# 08l0, 08l1: step 08 with its K/V reads without the L2 hint, and evict-first, at every shape
want hint && decode_runs ab08_hint --impls=08,08l0,08l1,torch-cudnn,torch-flash
if want ring; then
  impls=--impls=08,08r6,torch-cudnn,torch-flash,torch-efficient
  run ab08_ring --decode --causal 0 $impls
  run ab08_ring_gqa --decode --causal 0 --Nq 1 --bh 32,128 --group 8 $impls
fi
if want order; then
  run ab07_order --dir fwd --causal 1 --impls 07,07h1,07h9,07h7,torch-cudnn
  run ab07bwd_order --dir bwd --causal 1 --impls 07,07b12,07det,torch-cudnn
fi
if want last; then
  run ab07_last --dir fwd --causal 1 --impls 07,07h10,07h11,07h1,07h9,07h7,torch-cudnn
  run ab07bwd_last --dir bwd --causal 1 --impls 07,07b14,07b15,07b12,07det,torch-cudnn
fi
if want call; then
  python3 tools/bench/timeline.py --lib "$BUILD/tools/bench/libfa_capi.so" --impls "${CALL_IMPLS:-07,07b7,torch-cudnn}" \
    --d 64,128,256 --N 1024,4096 --causal 0,1 --tokens 131072 --csv "$R/timeline07bwd.csv" > "$L/timeline07bwd.log" 2>&1 || tail -20 "$L/timeline07bwd.log"
  grep "^  = " "$L/timeline07bwd.log"; stamp timeline
  run ab07bwd_call --dir bwd --causal 0,1 --impls "${CALL_IMPLS:-07,07b7,torch-cudnn}" --N 1024,2048,4096,8192,16384 \
    --tokens "${CALL_TOKENS:-131072,524288}"
fi
want b9 && run ab07bwd_b9 --dir bwd --causal 0,1 --impls 07,07b8,torch-cudnn
want b10 && run ab07bwd_b10 --dir bwd --causal 0,1 --d 64,128 --impls 07,07b9,torch-cudnn
want b11 && run ab07bwd_b11 --dir bwd --causal 0,1 --d 64,128 --impls 07,07b10,07b9,torch-cudnn
want b12 && run ab07bwd_b12 --dir bwd --causal 0,1 --impls 07,07b11,07det,torch-cudnn
want b16 && run ab07bwd_b16 --dir bwd --causal 0,1 --d 256 --impls 07,07b12,07b14,07b15,07det,torch-cudnn
want det && run ab07bwd_det --dir bwd --causal 0,1 --impls 07,07det,torch-cudnn --N "${DET_N:-1024,2048,4096,8192}"
want bwdpeers && run ab07bwd --dir bwd --causal 0,1 --impls 07,07b11,07b10,07b9,07b8,06,torch-cudnn,torch-flash
want bwdmain && run ab07bwd --dir bwd --causal 0,1 --impls 07,06,torch-cudnn,torch-flash
want bwd && run ab07bwd --dir bwd --causal 0,1 --impls 07,07b4,07b5,07b6,07b7,07b8,07b9,07b10,07b11,06,torch-cudnn,torch-flash
if want host; then
  run ab07bwd_spin200 --dir bwd --causal 0,1 --impls 07,torch-cudnn --d "${HOST_D:-64,128,256}" --hide-host-us 200
  run ab07bwd_spin2000 --dir bwd --causal 0,1 --impls 07,torch-cudnn --d "${HOST_D:-64,128,256}" --hide-host-us 2000
fi
exit 0
