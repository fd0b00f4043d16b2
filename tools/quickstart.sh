#!/usr/bin/env bash
# Quick start on a fresh Debian/Ubuntu machine: install what is missing from the
# distribution, build, run the tour.
#
#   bash tools/quickstart.sh           # no GPU (or --cpu): the cpu preset, build-cpu/
#                                      # with a GPU and nvcc: every step, build/
#   bash tools/quickstart.sh --cuda    # every step with nvcc, GPU or not (CI: the kernels compile)
#
# Then, without a GPU: notes/00_reference.md, and the first exercise
#   /usr/bin/python3 tools/course/exercise.py start 01-flops
# Extra CMake arguments pass through, e.g. -DFA_WERROR=ON or -DCMAKE_CUDA_ARCHITECTURES=80.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=auto
case "${1:-}" in --cpu) mode=cpu; shift ;; --cuda) mode=cuda; shift ;; esac

# Debian/Ubuntu packages: compiler, CMake, Ninja, Eigen, Catch2, Doxygen, and Python with
# NumPy and Matplotlib (the course's scripts: exercise.py, plot_trace.py, plot_traffic.py).
need=()
for pkg in g++ cmake ninja-build libeigen3-dev catch2 doxygen python3 python3-numpy python3-matplotlib; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The distribution's interpreter has the packages above; a python3 earlier on PATH (pyenv,
# conda, a venv) may not. The course's scripts start with #!/usr/bin/python3.
py=/usr/bin/python3
"$py" -c "import numpy, matplotlib" 2>/dev/null || { echo "$py cannot import numpy and matplotlib"; exit 1; }

# nvcc is usually installed outside PATH.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
# A GPU to run on: nvidia-smi finds one and nvcc is there. Otherwise the CPU-only build
# (the models, their tests, the exercises): minutes instead of the kernels' half hour.
if [ $mode = cuda ] && ! command -v nvcc >/dev/null; then echo "--cuda: no nvcc found"; exit 1; fi
if [ $mode = cuda ] || { [ $mode = auto ] && command -v nvcc >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU; }; then
  dir=build
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
  cmake --build build
else
  dir=build-cpu
  echo "no GPU found (or --cpu): building the CPU models, their tests and the exercises (cmake --preset cpu)"
  cmake --preset cpu "$@"
  cmake --build --preset cpu
fi
if command -v doxygen >/dev/null; then cmake --build "$dir" --target docs >/dev/null; fi
"./$dir/tools/flashattn/flashattn" tour
cat <<MSG

Built in $dir/. Python for the course's scripts: $py (it has NumPy and Matplotlib).
Next: read notes/00_reference.md, then start the first exercise:
  $py tools/course/exercise.py start 01-flops
MSG
if [ "$dir" = build-cpu ]; then
  echo "  cmake --build --preset cpu --target step01_tests && ctest --preset cpu -R \"step01 cpu\""
else
  echo "  cmake --build build --target step01_tests && ctest --test-dir build -R \"step01 cpu\""
fi
