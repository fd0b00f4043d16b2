#!/usr/bin/env bash
# The device call for counter.patch; written 2026-12-04, run on 2026-12-05 (what it brought back: counter/).
# Here (any machine with nvcc): git apply notes/lab/results/h200/tries/step08_flow/counter.patch, configure with
# -DCMAKE_CUDA_ARCHITECTURES=90, build step08_tests fa_capi fa_read_floor, and copy the three binaries into
# build-exp/bin/. On the device (carry build-exp/bin; FA_COMMIT names the tree):
#   FA_COMMIT="<sha>+counter.patch" bash notes/lab/results/h200/tries/step08_flow/call.sh
# It writes $OUT/all.tgz: the board's part number (the machine's class: note 08's appendix, "The H200s of the
# last calls"), step 08's GPU tests, the three sanitizers on the counter's test case, then, at note 08's 40
# decoding shapes, production beside the patch's rows n1 (production before the counter), f1 (the counter at
# every shape), f2 and f3 (16- and 64-tile chunks), cuDNN and FA-2, and the read floor. About 6 minutes.
set -uo pipefail
ROWS=08n1,08f1,08f2,08f3; T="step08 chunks from a counter*"
W=$(mktemp -d); mkdir -p $W/r $W/l
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
trap 'tar -czf "$OUT/all.tgz" -C "$W" .' EXIT
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1
  python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())" 2>&1
  echo "$FA_COMMIT"; } > "$W/r/device.txt"
nvidia-smi -q | grep -E "Product Name|VBIOS Version|Board Part Number" | sed 's/^ *//; s/  */ /g' > $W/r/board.txt
cat $W/r/board.txt
B=${BIN:-build-exp/bin}
( timeout 300 $B/step08_tests --gpu "[gpu]" > $W/l/test-step08.log 2>&1; echo "step08 [gpu] rc=$? $(tail -2 $W/l/test-step08.log | tr '\n' ' ')" ) &
for tool in memcheck racecheck synccheck; do
  ( FA_TEST_QUICK=1 timeout 280 compute-sanitizer --tool $tool --error-exitcode 9 $B/step08_tests --gpu "$T" > $W/l/san-$tool.log 2>&1
    echo "$tool rc=$? $(grep -hE 'SUMMARY|passed|failed' $W/l/san-$tool.log | tr '\n' ' ')" ) &
done
wait; stamp tested
grep -B3 -A20 "FAILED" $W/l/test-step08.log | head -40
ab() { local name=$1; shift; python3 tools/bench/ab.py --lib $B/libfa_capi.so --rounds 3 --check-peers --csv $W/r/$name.csv "$@" 2> $W/l/$name.log; tail -1 $W/l/$name.log; stamp $name; }
I=--impls=08,$ROWS,torch-cudnn,torch-flash
ab c_bh128 --decode --causal 0 --Nq 1,16 --bh 128 $I
ab c_bh32 --decode --causal 0 --Nq 1,16 --bh 32 $I
ab c_gqa --decode --causal 0 --Nq 1 --bh 32,128 --group 8 $I
ab c_causal --decode --causal 1 --Nq 16 $I
$B/fa_read_floor > $W/r/floor.csv 2> $W/r/clusters.txt; stamp floor
awk -F, '($2==128 && $3==131072 && $10==1 && $7==4 && ($6=="static"||$6=="flow")) {print $6,$8,$9,$11,$13,$14,$15}' $W/r/floor.csv
