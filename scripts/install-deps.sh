#!/usr/bin/env bash
# Installs dhelix's build and test dependencies from Debian packages. Idempotent: when
# every package is present it installs nothing and touches no network.
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is not installed here; CMake uses it when present.
set -euo pipefail

packages=(
  build-essential cmake git pkg-config
  libcli11-dev nlohmann-json3-dev libboost-graph-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin libopenblas-dev
  python3 python3-jsonschema chromium
  clang libclang-rt-14-dev  # scripts/fuzz.sh: libFuzzer and the sanitizer runtimes for clang 14
)

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
