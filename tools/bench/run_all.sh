#!/usr/bin/env bash
# Everything issue 6 measures, in one run on a CUDA machine with an already built
# tree (tools/device/gpu_check.sh builds one): the step sweep, PyTorch's backends,
# the largest N per step, ncu's DRAM bytes, and the plots. Results go to $1.
#
#   bash tools/bench/run_all.sh notes/results/h200 [build-gpu]
# then, anywhere (stdlib only):  python3 tools/bench/update_docs.py notes/results/h200
set -uo pipefail
dest=${1:?results folder}
BUILD=${2:-build-gpu}
mkdir -p "$dest"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$dest/device.txt"
nvcc --version | tail -1 >> "$dest/device.txt"
python3 -c "import torch; print('torch', torch.__version__)" >> "$dest/device.txt" 2>&1
echo "== $(date +%T) fa_bench sweep"
"$BUILD/tools/bench/fa_bench" --csv "$dest/bench.csv" --reps 7 2> "$dest/bench.log"; tail -3 "$dest/bench.log"
echo "== $(date +%T) step 06 and PyTorch's 16-bit backends on the same shapes"
bash tools/bench/step06_bench.sh "$dest" "$BUILD"
echo "== $(date +%T) fa_bench --max-n"
"$BUILD/tools/bench/fa_bench" --max-n --csv "$dest/maxn.csv" 2> "$dest/maxn.log"; cat "$dest/maxn.csv"
echo "== $(date +%T) backward memory, N up to what step 01 can hold (B = H = 1)"
"$BUILD/tools/bench/fa_bench" --steps 01,05 --dir bwd --d 64 --causal 0 --tokens 1 --reps 3 \
  --N 1024,2048,4096,8192,16384,32768,65536,131072 --csv "$dest/memory.csv" 2> "$dest/memory.log"
cut -d, -f2,7,10,12,13,18 "$dest/memory.csv"
echo "== $(date +%T) peers"
python3 tools/bench/peers.py --csv "$dest/peers.csv" --reps 7 2> "$dest/peers.log"; tail -3 "$dest/peers.log"
echo "== $(date +%T) ncu traffic"
python3 tools/bench/ncu_traffic.py --bench "$BUILD/tools/bench/fa_bench" --csv "$dest/traffic.csv" 2> "$dest/ncu.log"
cat "$dest/traffic.csv"
echo "== $(date +%T) the lecture's claims: speed-up over standard attention, memory against N"
bash tools/bench/claims.sh "$dest" "$BUILD"
echo "== $(date +%T) plots"
python3 tools/bench/plot.py --dir "$dest" && ls "$dest"
