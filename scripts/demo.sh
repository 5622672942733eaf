#!/usr/bin/env bash
# The README's main command: installs what is missing (the core set: compiler, CMake and
# the libraries the tools link; not what only the tests need), builds the four tools with
# their progress shown, and plans a shipped example job end to end: the job's operators are
# timed on the fly with the analytic model, the pairing search, folding and W pipeline run,
# the plan goes to out/plan.json and the report (dhelix against Wavelet+, intra-batch
# overlap and Megatron-LM 1F1B) is printed.
#
#   scripts/demo.sh [job.json]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh core
echo "demo: building the tools (dhelix-plan, dhelix-profile, dhelix-run, dhelix-diff)" >&2
# Tests and benchmarks need packages the core set leaves out; scripts/test.sh turns them
# back on in the same build folder.
DHELIX_TARGETS="dhelix-plan dhelix-profile dhelix-run dhelix-diff" \
  scripts/build.sh -DDHELIX_BUILD_TESTS=OFF -DDHELIX_BUILD_BENCHMARKS=OFF
job=${1:-examples/jobs/llama-25b-a40-dp8-tp8.json}
mkdir -p out
echo "demo: planning $job" >&2
"${DHELIX_BUILD_DIR:-build}/tools/dhelix-plan" "$job" -o out/plan.json
