#!/usr/bin/env bash
# Quick start on a fresh Debian/Ubuntu machine: install what is missing, build
# everything (the GPU steps too when nvcc is present), run the tour.
#
#   bash tools/quickstart.sh            # then: ctest --test-dir build --output-on-failure
#
# Extra CMake arguments pass through, e.g. -DFA_WERROR=ON or -DCMAKE_CUDA_ARCHITECTURES=80.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian/Ubuntu packages: compiler, CMake, Ninja, Eigen, Catch2, Doxygen, Python.
need=()
for pkg in g++ cmake ninja-build libeigen3-dev catch2 doxygen; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
command -v python3 >/dev/null || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

# nvcc is usually installed outside PATH.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build
if command -v doxygen >/dev/null; then cmake --build build --target docs; fi
./build/tools/flashattn/flashattn tour
