#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
ctest --test-dir "${DHELIX_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 600
