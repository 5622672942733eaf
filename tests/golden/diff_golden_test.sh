#!/usr/bin/env bash
# Golden test of dhelix-diff: for every pair of tests/golden/diff_pairs.txt, runs
# dhelix-diff --json on the checked-in plans and compares its output with the expected
# file by meaning (compare_json.py: numbers within 1e-6 relative, `meta` ignored), and
# checks the output against schemas/diff.schema.json.
# Usage: diff_golden_test.sh <dir-with-binaries> <source-dir>
set -u

bin_dir=$(cd "$1" && pwd)
src_dir=$(cd "$2" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$src_dir"

failed=0
checked=0
while read -r expected a b; do
  [[ -z $expected || $expected == \#* ]] && continue
  checked=$((checked + 1))
  actual="$scratch/$(basename "$expected")"
  if ! "$bin_dir/dhelix-diff" --json "$a" "$b" >"$actual"; then
    echo "FAIL  $expected: dhelix-diff exited non-zero"
    failed=$((failed + 1))
  elif ! /usr/bin/python3 - "$actual" schemas/diff.schema.json <<'PY'
import json, sys
import jsonschema
errors = list(jsonschema.Draft202012Validator(json.load(open(sys.argv[2]))).iter_errors(
    json.load(open(sys.argv[1]))))
for e in errors[:5]:
    print("/" + "/".join(str(p) for p in e.absolute_path) + ": " + e.message)
sys.exit(1 if errors else 0)
PY
  then
    echo "FAIL  $expected: dhelix-diff's output does not match schemas/diff.schema.json"
    failed=$((failed + 1))
  elif ! /usr/bin/python3 tests/golden/compare_json.py "$expected" "$actual"; then
    echo "FAIL  $expected (regenerate with tests/golden/regenerate.sh if the change is meant)"
    failed=$((failed + 1))
  fi
done <tests/golden/diff_pairs.txt
echo "$checked golden diffs checked, $failed failed"
[[ $checked -gt 0 && $failed -eq 0 ]]
