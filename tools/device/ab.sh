#!/usr/bin/env bash
# The steps beside PyTorch's attention in one process, on the same tensors, in alternation
# (tools/bench/ab.py over libfa_capi.so), on the H200 in one call.
#   [PHASE=fwd|bwd|gqa|ragged|window|base|host|decode|paged|floor|cluster|pause|gemm|h9|call|det|all, or several: PHASE=fwd,decode]
#   [ROUNDS=5] bash tools/device/ab.sh [build-dir]
# gemm:   the bf16 matrix-product rate, timed the same way (also in fwd);
# fwd:    step 07's forward, step 06, cuDNN and FlashAttention-2, d = 64, 128, 256,
#         N = 1k–32k, causal and not, B·H·N = 131072 and 524288 (note 07's tables);
# bwd:    the same for the backward;
# gqa:    step 07 with grouped K/V heads (4 and 8 query heads a K/V head) beside cuDNN and
#         FlashAttention-2 (enable_gqa; K, V repeated where a backend refuses it), forward and
#         backward, d = 64, 128, N = 1k–16k, causal and not, B·H·N = 131072;
# ragged: step 07's forward and backward on a ragged batch (8 sequences packed, 07r) beside the same batch
#         dense (07), and on mixed lengths (N/2, 3N/2: 07m), d = 64, 128, 256, N = 1k–8k,
#         causal and not, B·H·N = 131072 (note 07, "Attention as models use it");
# window: step 07 with a sliding window (none, 4096, 1024, 256 keys before, causal; 512 either
#         side) beside cuDNN on the band as a mask, d = 64, 128, N = 8k and 16k, both directions;
# base:   step 07 of this tree beside step 07 of another (BASE=DIR: a tree without its history,
#         e.g. `git archive main | tar -x -C DIR` here; its fa_capi built there too) and cuDNN,
#         forward and backward, d = 64, 128, 256, N = 1k–16k, causal and not, B·H·N = 131072;
# host:   step 07 and cuDNN's backward behind a spin of 200 µs and of 2000 µs, one after the
#         other (PyTorch's backward enqueues for longer than 200: ab.py's host_us_max; a
#         longer spin is also a longer rest for the GPU between repeats);
# decode: step 08, step 06 and PyTorch's backends on note 08's decoding shapes;
# paged:  step 08 on the same caches in shuffled pages of 16, 64 and 256 positions (08p16, …)
#         beside it on the contiguous cache and cuDNN, FlashAttention-2 (on the contiguous cache:
#         PyTorch takes no block table), d = 64 and 128, one query and sixteen (causal);
# floor:  K and V read once with step 08's copy and nothing computed (tools/bench/read_floor.cu),
#         at the K/V sizes of note 08's decoding shapes: static cuts, chunks from a counter,
#         bulk copies (Hopper), fewer blocks, two an SM, and clusters (the clusters held at once
#         into clusters.txt);
# cluster: step 08 beside cuDNN and FlashAttention-2 at the shapes where the H200 merges each
#         unit's parts in a cluster of its blocks (B·H = 15, 30, 39, 66; 15 K/V heads of 8);
# h9:     the forward's persistent grid (lesson row h9, production at d = 64 and 128 but for
#         d = 64's short problems) beside a block a tile (h7) and cuDNN, d = 64, 128, 256 (H9_D),
#         N = 1k–32k, causal and not, both B·H·N;
# pause:  step 07 and cuDNN at d = 128 and 256 timed with no pause and after 500 ms of
#         rest before every block (note 07, "How far one run can be trusted");
# call:   the backward's fixed costs: every kernel and memset of one call of step 07 and of
#         cuDNN, as the GPU ran them (tools/bench/timeline.py), then the two timed at
#         N = 1k–16k (CALL_IMPLS: other implementations than 07,torch-cudnn);
# det:    the deterministic mode (07det) beside step 07 and cuDNN, d = 64, 128, 256, N = 1k–8k
#         (DET_N), causal and not, both B·H·N.
# Results (ab*.csv, device.txt) into $OUT/results.tgz (and $RESULTS, if given), to be
# unpacked into notes/results/h200/ab; logs into $OUT/logs.tgz.
set -uo pipefail
source "$(dirname "$0")/start.sh"  # device_start, stamp, build90
PHASE=${PHASE:-all}; ROUNDS=${ROUNDS:-5}
for p in ${PHASE//,/ }; do
  [[ " fwd bwd gqa ragged window base host decode paged floor cluster pause gemm h9 call det all " == *" $p "* ]] ||
    { echo "ab.sh: unknown phase '$p' (fwd, bwd, gqa, ragged, window, base, host, decode, paged, floor, cluster, pause, gemm, h9, call, det, all)"; exit 2; }
done
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
if want gqa; then
  for dir in fwd bwd; do
    run ab07_gqa_$dir --dir $dir --impls 07,torch-cudnn,torch-flash --d 64,128 --N 1024,2048,4096,8192,16384 \
      --causal 0,1 --tokens 131072 --group 4,8
  done
fi
if want ragged; then
  run ab07_ragged --dir fwd --impls 07,07r,07m --ragged 8 --N 1024,2048,4096,8192 --causal 0,1 --tokens 131072
  run ab07_ragged_bwd --dir bwd --impls 07,07r,07m --ragged 8 --N 1024,2048,4096,8192 --causal 0,1 --tokens 131072
fi
if want window; then
  for dir in fwd bwd; do
    run ab07_window_$dir --dir $dir --impls 07,torch-cudnn --d 64,128 --N 8192,16384 --causal 1 --tokens 131072 \
      --windows=-1:-1,4096:0,1024:0,256:0
    run ab07_window2_$dir --dir $dir --impls 07,torch-cudnn --d 64,128 --N 8192,16384 --causal 0 --tokens 131072 \
      --windows=-1:-1,512:512
  done
fi
if [[ ",$PHASE," == *",base,"* ]]; then  # only when asked: it needs BASE
  [ -d "${BASE:-}" ] || { echo "ab.sh: phase base needs BASE=DIR, another tree"; exit 2; }
  base=$(cd "$BASE" && pwd); mkdir -p "$L/base"
  (cd "$base" && BUILD=$base/build-gpu L=$L/base configured= build90 fa_capi) || exit 1
  for dir in fwd bwd; do
    run ab07_base_$dir --dir $dir --impls 07,07@base,torch-cudnn --alt "base=$base/build-gpu/tools/bench/libfa_capi.so" \
      --d 64,128,256 --N 1024,2048,4096,8192,16384 --causal 0,1 --tokens 131072
  done
fi
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
want decode && decode_runs ab08 --impls=08,06,torch-cudnn,torch-flash,torch-efficient
if want paged; then
  PAGED=08,08p16,08p64,08p256,torch-cudnn,torch-flash
  run ab08_paged --decode --causal 0 --Nq 1 --d 64,128 --impls=$PAGED
  run ab08_paged_causal --decode --causal 1 --Nq 16 --d 128 --impls=$PAGED
  run ab08_paged_gqa --decode --causal 0 --Nq 1 --bh 32,128 --group 8 --d 128 --impls=$PAGED
fi
# The floor under them: K and V read once by step 08's copy, nothing computed, at the K/V
# sizes of those shapes (B·H_kv = 4, 16, 32, 128), in static cuts and in chunks from a counter
if want floor; then
  "$BUILD/tools/bench/fa_read_floor" > "$R/floor.csv" 2> "$R/clusters.txt"; stamp "floor (rc $?)"
fi
# Production merges in clusters where every unit's chunks fit one and all the clusters fit at
# once — on the H200 15 units of 8 chunks, 30 of 4, 39 of 3, 66 of 2, not the decoding shapes
# above (note 08, "The merge in a cluster").
if want cluster; then
  impls=--impls=08,torch-cudnn,torch-flash
  run ab08_cluster --decode --causal 0 --bh 15,30,39,66 $impls
  run ab08_cluster_gqa --decode --causal 0 --Nq 1 --bh 120 --group 8 $impls
fi
if want call; then
  python3 tools/bench/timeline.py --lib "$BUILD/tools/bench/libfa_capi.so" --impls "${CALL_IMPLS:-07,torch-cudnn}" \
    --d 64,128,256 --N 1024,4096 --causal 0,1 --tokens 131072 --csv "$R/timeline07bwd.csv" > "$L/timeline07bwd.log" 2>&1 || tail -20 "$L/timeline07bwd.log"
  grep "^  = " "$L/timeline07bwd.log"; stamp timeline
  run ab07bwd_call --dir bwd --causal 0,1 --impls "${CALL_IMPLS:-07,torch-cudnn}" --N 1024,2048,4096,8192,16384 \
    --tokens "${CALL_TOKENS:-131072,524288}"
fi
want det && run ab07bwd_det --dir bwd --causal 0,1 --impls 07,07det,torch-cudnn --N "${DET_N:-1024,2048,4096,8192}"
want bwd && run ab07bwd --dir bwd --causal 0,1 --impls 07,06,torch-cudnn,torch-flash
if want host; then
  run ab07bwd_spin200 --dir bwd --causal 0,1 --impls 07,torch-cudnn --d "${HOST_D:-64,128,256}" --hide-host-us 200
  run ab07bwd_spin2000 --dir bwd --causal 0,1 --impls 07,torch-cudnn --d "${HOST_D:-64,128,256}" --hide-host-us 2000
fi
exit 0
