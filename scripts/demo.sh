#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and plans a shipped example
# job end to end: the job's operators are timed on the fly with the analytic model, the
# pairing search, folding and W pipeline run, the plan goes to out/plan.json and the report
# (dhelix against Wavelet+, intra-batch overlap and Megatron-LM 1F1B) is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh >/dev/null
job=${1:-examples/jobs/llama-25b-a40-dp8-tp8.json}
mkdir -p out
build/tools/dhelix-plan "$job" -o out/plan.json
