#!/usr/bin/env bash
# Installs dhelix's dependencies from Debian packages. Idempotent: when every package is
# present it installs nothing and touches no network.
#
#   scripts/install-deps.sh [core|all]     (default all)
#
# core: what building the tools and running them needs (scripts/demo.sh, the README);
# all:  core plus what the test suite needs (GoogleTest, Google Benchmark, the schema
#       validator, Chromium for rendering pictures, Graphviz for the walkthrough's DAG,
#       clang for scripts/fuzz.sh). scripts/test.sh installs all.
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is not installed here; CMake uses it when present.
set -euo pipefail

set_name=${1:-all}
core_packages=(
  build-essential cmake git pkg-config
  libcli11-dev nlohmann-json3-dev libboost-graph-dev libfmt-dev
  libopenmpi-dev openmpi-bin libopenblas-dev
)
test_packages=(
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-jsonschema chromium graphviz
  clang libclang-rt-14-dev  # scripts/fuzz.sh: libFuzzer and the sanitizer runtimes for clang 14
  file  # cpack -G DEB (README's Installing section, run by e2e_docs) calls it
  iproute2  # scripts/shaped-link.sh: ip and tc shape the ranks' link (unshare: util-linux)
  time  # /usr/bin/time in tests/bench/coexec/settings.sh, scripts/compare-planner-builds.sh
  shellcheck  # tests/e2e/gpu_scripts_test.sh checks the GPU machine scripts with it
)
case "$set_name" in
  core) packages=("${core_packages[@]}") ;;
  all) packages=("${core_packages[@]}" "${test_packages[@]}") ;;
  *)
    echo "install-deps: unknown set \"$set_name\"; use core or all" >&2
    exit 2
    ;;
esac

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
