#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs dhelix on a
# shipped example job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh >/dev/null
job=${1:-examples/jobs/llama-25b-a40.json}
build/tools/dhelix-plan --validate-only "$job"
