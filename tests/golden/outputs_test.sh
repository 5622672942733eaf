#!/usr/bin/env bash
# Golden test of every tool output on the shipped examples: regenerates them all
# (outputs.sh) in a scratch folder and compares with tests/golden/outputs/ byte for byte.
# A difference is either a regression or a deliberate change; for the latter run
# tests/golden/regenerate.sh BUILD_DIR and review `git diff`.
# Usage: outputs_test.sh BUILD_DIR SRC_DIR
set -u

build_dir=$(cd "$1" && pwd)
src_dir=$(cd "$2" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

"$src_dir/tests/golden/outputs.sh" "$build_dir" "$src_dir" "$scratch/outputs" || {
  echo "FAIL  outputs.sh did not finish"
  exit 1
}
if diff -r --brief "$src_dir/tests/golden/outputs" "$scratch/outputs"; then
  echo "$(find "$scratch/outputs" -type f | wc -l) golden outputs identical"
  exit 0
fi
# The first lines of each difference, to see what changed without regenerating.
diff -r "$src_dir/tests/golden/outputs" "$scratch/outputs" | head -60
echo "FAIL  outputs differ from tests/golden/outputs (tests/golden/regenerate.sh if meant)"
exit 1
