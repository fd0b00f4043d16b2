#!/usr/bin/env bash
# flow2.patch's device call (written 2026-12-04; not yet run: no GPU machine was lent that session).
# Here (any machine with nvcc): git apply notes/results/h200/tries/step08_flow/flow2.patch, configure with
# -DCMAKE_CUDA_ARCHITECTURES=90, build step08_tests fa_capi fa_read_floor, and copy the three binaries into
# build-exp/bin/. On the device (carry build-exp; FA_COMMIT names the tree):
#   FA_COMMIT="<sha>+flow2.patch" bash notes/results/h200/tries/step08_flow/call2.sh
# It writes $OUT/all.tgz: the board's part number (the machine's class: note 08's appendix, "The H200s of the last calls"),
# step 08's GPU tests, the three sanitizers on the f1 test case (whose markers now go by st.async), then
# production beside f0, f1, f2 (16-tile chunks), f3 (64), cuDNN and FA-2 at note 08's 40 decoding shapes,
# and the read floor. About 5 minutes.
set -uo pipefail
W=$(mktemp -d); mkdir -p $W/r $W/l
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
trap 'tar -czf "$OUT/all.tgz" -C "$W" .' EXIT
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1
  python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())" 2>&1
  echo "$FA_COMMIT"; } > "$W/r/device.txt"
nvidia-smi -q | grep -E "Product Name|VBIOS Version|Board Part Number" | sed 's/^ *//; s/  */ /g' > $W/r/board.txt
cat $W/r/board.txt
B=${BIN:-build-exp/bin}; T="step08 (try) f1*"
( timeout 300 $B/step08_tests --gpu "[gpu]" > $W/l/test-step08.log 2>&1; echo "step08 [gpu] rc=$? $(tail -2 $W/l/test-step08.log | tr '\n' ' ')" ) &
for tool in memcheck racecheck synccheck; do
  ( FA_TEST_QUICK=1 timeout 280 compute-sanitizer --tool $tool --error-exitcode 9 $B/step08_tests --gpu "$T" > $W/l/san-$tool.log 2>&1
    echo "$tool rc=$? $(grep -hE 'SUMMARY|passed|failed' $W/l/san-$tool.log | tr '\n' ' ')" ) &
done
wait; stamp tested
grep -B3 -A20 "FAILED" $W/l/test-step08.log | head -40
ab() { local name=$1; shift; python3 tools/bench/ab.py --lib $B/libfa_capi.so --rounds 3 --check-peers --csv $W/r/$name.csv "$@" 2> $W/l/$name.log; tail -1 $W/l/$name.log; stamp $name; }
I=--impls=08,08f0,08f1,08f2,08f3,torch-cudnn,torch-flash
ab f_bh128 --decode --causal 0 --Nq 1,16 --bh 128 $I
ab f_bh32 --decode --causal 0 --Nq 1,16 --bh 32 $I
ab f_gqa --decode --causal 0 --Nq 1 --bh 32,128 --group 8 $I
ab f_causal --decode --causal 1 --Nq 16 $I
$B/fa_read_floor > $W/r/floor.csv 2> $W/r/clusters.txt; stamp floor
awk -F, '($2==128 && $3==131072 && $10==1 && $7==4 && ($6=="static"||$6=="flow")) {print $6,$8,$9,$11,$13,$14,$15}' $W/r/floor.csv
