#!/usr/bin/env bash
# Prints the generated part of docs/validation.md (between its "validation-table" markers):
# 1. one row per A40, A800 and H100 example job: TFLOPS/GPU of Megatron 1F1B, intra-batch,
#    Wavelet+ and DHelix, the speed-ups over Megatron, DHelix tokens/s, the pairing scope,
#    the DHelix bubble and whether the DHelix plan fits (jobs are planned with --allow-oom,
#    so that those that do not fit still show their figures);
# 2. every measured figure the DHelix paper's text and shared/reference/prior-art.md state,
#    beside the prediction, the error of each and the mean absolute error.
# tests/e2e/validation_table_test.sh checks that the page is current.
# Usage: scripts/validation-table.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
plan=${1:-build}/tools/dhelix-plan
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for job in examples/jobs/*a40*.json examples/jobs/*a800*.json examples/jobs/*h100*.json; do
  name=$(basename "$job" .json)
  "$plan" "$job" --allow-oom -o "$scratch/$name.json" >/dev/null 2>&1 || {
    echo "validation-table.sh: dhelix-plan failed on $job" >&2
    exit 1
  }
done
exec /usr/bin/python3 scripts/validation_figures.py "$scratch"
