#!/usr/bin/env bash
# Configures and builds dhelix into build/ (or $DHELIX_BUILD_DIR) with every core.
#
#   scripts/build.sh [cmake configure options...]
#
# DHELIX_TARGETS (space-separated) builds only those targets (scripts/demo.sh: the tools).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${DHELIX_BUILD_DIR:-build}
# nvcc lives outside the default PATH on CUDA machines; CMake finds CUDA through it.
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null 2>&1; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# -O2 without debug information: the code RelWithDebInfo makes (the figures in docs/ were
# measured with it), built about 30 % faster (CI builds everything on two cores). Pass
# -DCMAKE_BUILD_TYPE=RelWithDebInfo to debug.
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DDHELIX_WERROR=ON "$@" >/dev/null
target_args=()
for target in ${DHELIX_TARGETS:-}; do
  target_args+=(--target "$target")
done
cmake --build "$build_dir" -j "$(nproc)" "${target_args[@]}"
