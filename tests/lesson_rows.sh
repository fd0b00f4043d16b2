#!/usr/bin/env bash
# Note 07's backward rows b5, b7, b9 and b11 are patches on the production backward
# (notes/lab/patches/07_bwd_*.patch). Each must still apply to this tree and compile as the
# build compiles step 07 (sm_90a; warnings as errors where the build has them): a change to
# production that moves the code under a row fails here, on a machine without a GPU, not
# first on the device (tools/device/lesson07_patches.sh, which also runs each row's tests).
#   bash tests/lesson_rows.sh SOURCE_DIR NVCC [HOST_COMPILER] [werror]
set -uo pipefail
src=$(cd "$1" && pwd) || exit 1
nvcc=$2 host=${3:-} werror=${4:-}
command -v git >/dev/null || { echo "git not found (it applies the patches): not run"; exit 77; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
flags=(-DFA_HAVE_CUDA=1 -O3 -DNDEBUG -std=c++20 -gencode=arch=compute_90a,code=sm_90a --Wreorder)
[ -n "$host" ] && flags+=(-ccbin "$host")
[ "$werror" = werror ] && flags+=(-Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror)
rc=0
for patch in "$src"/notes/lab/patches/07_bwd_*.patch; do
  row=$(basename "$patch" .patch)
  tree=$tmp/$row
  # The files the patch changes, copied from the source; everything else read from there.
  files=$(sed -n 's#^+++ b/##p' "$patch")
  for f in $files; do mkdir -p "$tree/$(dirname "$f")" && cp "$src/$f" "$tree/$f"; done
  # (Outside any repository: inside one, git apply skips paths it does not track and succeeds.)
  out=$(cd "$tree" && GIT_CEILING_DIRECTORIES="$tmp" git apply "$patch" 2>&1)
  applied=$?
  for f in $files; do cmp -s "$src/$f" "$tree/$f" && applied=1; done  # every file it names changed
  if [ $applied -ne 0 ]; then
    echo "$row: does not apply to this tree's $files"
    echo "$out" | head -5
    rc=1
    continue
  fi
  start=$(date +%s)
  if ! out=$("$nvcc" "${flags[@]}" -I"$tree" -I"$src" -x cu -c "$tree/steps/07_hopper/backward.cu" \
      -o "$tree/backward.o" 2>&1); then
    echo "$row: applies, does not compile"
    echo "$out" | grep -m 10 -E "error|warning" || echo "$out" | tail -5
    rc=1
    continue
  fi
  echo "$row: applies and compiles ($(($(date +%s) - start)) s)"
done
exit $rc
