#!/usr/bin/env bash
# The PTX of every CUDA source of steps 06-09 and tools/bench, compiled as BUILD_DIR compiles
# it (its ninja commands, -ptx instead of -c; sm_90a for step 07, sm_90 elsewhere), one .ptx a
# source into OUT_DIR. With tools/bench/ptx_compare.py: a refactor's kernels against the
# commit before it, no GPU needed.
#   bash tools/bench/ptx_of.sh BUILD_DIR SRC_ROOT OUT_DIR
build=$1; src=$2; out=$3; mkdir -p $out
cd $build
ninja -t commands | grep -E "nvcc .* -c [^ ]*(steps/0[6-9]_[a-z_]+|tools/bench)/[a-z_0-9]+\.cu" | sort -u | while read -r cmd; do
  f=$(echo "$cmd" | grep -oE -- "-c [^ ]+\.cu" | awk '{print $2}')
  name=$(echo "$f" | sed -E "s|^$src/||; s|/|_|g; s|\.cu$||")
  c=$(echo "$cmd" | sed -E "s| -o [^ ]+\.o| -o $out/$name.ptx|; s| -c | -ptx |; s| -MD -MT [^ ]+ -MF [^ ]+||; s|-Xptxas=-v||; s|-lineinfo||; s|--generate-code=[^ ]+||g; s|-gencode[= ][^ ]+||g")
  arch=-arch=compute_90; echo "$f" | grep -q 07_hopper && arch=-arch=compute_90a
  (eval "$c $arch" > $out/$name.log 2>&1 || echo "FAILED $f") &
  while [ $(jobs -r | wc -l) -ge 2 ]; do sleep 1; done
done
wait
