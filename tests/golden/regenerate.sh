#!/usr/bin/env bash
# Regenerates every checked-in output of the tools after a deliberate change to the cost
# model, the planner or dhelix-diff: the example profile (examples/profiles/), the example
# plans (examples/plans/), the golden plans (examples/plans/golden/) and the expected diffs
# (tests/golden/*.diff.json), and every output of the tools on the shipped examples
# (tests/golden/outputs/, compared byte for byte by outputs_test.sh).
#
# Usage, from anywhere: tests/golden/regenerate.sh BUILD_DIR
#   e.g.  cmake --build build --target dhelix-plan dhelix-diff dhelix_dump_rank_programs &&
#         tests/golden/regenerate.sh build
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
profile_tool="$build_dir/tools/dhelix-profile"
mkdir -p examples/plans/golden examples/profiles

# The example profile and plans that tests and docs read.
"$profile_tool" --backend model examples/jobs/llama-25b-a40-dp8-tp8.json \
  -o examples/profiles/llama-25b-a40-dp8-tp8.json
# tiny-*: the CPU jobs dhelix-run trains in the tests (runtime/, tests/runtime/).
jobs="llama-25b-a40-dp8-tp8 llama-39b-a40-dp2-tp8-cp2-pp2-seq16k tiny-tp2-pp2 tiny-dp2-tp2"
jobs+=" tiny-tp2 tiny-tp2-recompute tiny-cp2-tp2 tiny-moe-ep2 tiny-moe-ep2-pp2 tiny-moe-ep2-tp2"
jobs+=" tiny-moe-ep2-recompute"
for job in $jobs; do
  "$plan" "examples/jobs/$job.json" -o "examples/plans/$job.json" >/dev/null
done
# tiny-tp2-pp2 twice: as the paper's W with whole backwards (which tests/e2e/check_test.sh and
# split_backward_test.sh edit by task position) and as dhelix-plan chooses it by default, the V
# (planner/dhelix_shapes.h).
"$plan" examples/jobs/tiny-tp2-pp2.json --shape w --no-split-backward \
  -o examples/plans/tiny-tp2-pp2.json >/dev/null
"$plan" examples/jobs/tiny-tp2-pp2.json -o examples/plans/tiny-tp2-pp2-v.json >/dev/null
# And on Megatron's interleaved stages (v 2: model chunks of one layer), which
# tests/e2e/run_test.sh trains and check_test.sh tampers with.
"$plan" examples/jobs/tiny-tp2-pp2.json --shape interleaved \
  -o examples/plans/tiny-tp2-pp2-interleaved.json >/dev/null

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

# Every output of the tools on the shipped examples, compared byte for byte.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
tests/golden/outputs.sh "$build_dir" "$src_dir" "$scratch/outputs"
rm -rf tests/golden/outputs
cp -r "$scratch/outputs" tests/golden/outputs
echo "wrote tests/golden/outputs/"
