#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, runs every test, then
# fuzzes each file reader for a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DDHELIX_BUILD_TESTS=ON -DDHELIX_BUILD_BENCHMARKS=ON
ctest --test-dir "${DHELIX_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 600
# Smoke run of every reader's fuzz target on its checked-in corpus (about 2 minutes on two
# cores, most of it building dhelix_core with clang); scripts/fuzz.sh runs them longer.
scripts/fuzz.sh 10
