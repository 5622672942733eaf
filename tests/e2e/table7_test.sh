#!/usr/bin/env bash
# docs/cost-model.md's "Table 7 on the model" is what the H100 Table 7 jobs plan now: a change
# to the cost model or the H100 preset must update the table
# (scripts/table7-decomposition.py prints the figures).
# Usage: table7_test.sh BUILD_TOOLS_DIR SOURCE_DIR
set -euo pipefail
tools=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plans=()
for job in llama-25b-h100-dp4-tp8 llama-25b-h100-dp2-tp16 llama-25b-h100-dp1-tp32; do
  "$tools/dhelix-plan" "$src/examples/jobs/$job.json" -o "$work/$job.json" >/dev/null
  plans+=("$work/$job.json")
done
python3 "$src/scripts/table7-decomposition.py" --check "$src/docs/cost-model.md" "${plans[@]}"
echo "docs/cost-model.md's Table 7 decomposition is current"
