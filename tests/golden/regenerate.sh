#!/usr/bin/env bash
# Regenerates the golden plans (examples/plans/golden/) and the expected diffs
# (tests/golden/*.diff.json) after a deliberate change to the planner or to dhelix-diff.
#
# Usage, from anywhere: tests/golden/regenerate.sh BUILD_DIR
#   e.g.  cmake --build build --target dhelix-plan dhelix-diff && tests/golden/regenerate.sh build
#
# DHELIX_DETERMINISTIC=1 leaves host and date out of `meta`, and the tools are run from the
# source root with relative paths, so that regenerating on another machine changes only
# what the planner or the diff really changed. Review `git diff` before committing: the
# golden test (ctest -L golden) compares dhelix-diff's output with these files by meaning
# (tests/golden/compare_json.py: numbers within 1e-6 relative, `meta` ignored).
set -euo pipefail

build_dir=$(cd "${1:?usage: regenerate.sh BUILD_DIR}" && pwd)
src_dir=$(cd "$(dirname "$0")/../.." && pwd)
cd "$src_dir"
export DHELIX_DETERMINISTIC=1
plan="$build_dir/tools/dhelix-plan"
diff_tool="$build_dir/tools/dhelix-diff"
mkdir -p examples/plans/golden

# The same job (Llama 8B, dp16 x tp4, 8k tokens) planned for the A40 and the H100 cluster.
"$plan" examples/jobs/llama-8b-a40-dp16-tp4.json \
  -o examples/plans/golden/llama-8b-a40.plan.json >/dev/null
"$plan" examples/jobs/llama-8b-a40-dp16-tp4.json --cluster h100 \
  -o examples/plans/golden/llama-8b-h100.plan.json >/dev/null

# Expected diffs: one line per pair in tests/golden/diff_pairs.txt ("EXPECTED A B").
while read -r expected a b; do
  [[ -z $expected || $expected == \#* ]] && continue
  # dhelix-diff exits 0 here: no --fail-if flag is given.
  "$diff_tool" --json "$a" "$b" >"$expected"
  echo "wrote $expected"
done <tests/golden/diff_pairs.txt
