#!/usr/bin/env bash
# End-to-end tests of dhelix-diff's output and exit statuses (docs/diff.md):
# 0 no --fail-if condition met, 1 one met, 2 bad input, 3 unreadable file, 5 another major
# schema version. Usage: diff_test.sh <dir-with-binaries> <source-dir>
# The last line is "N passed, M failed"; the exit status is non-zero when anything failed.
set -u

bin_dir=$(cd "$1" && pwd)
src_dir=$(cd "$2" && pwd)
diff_tool="$bin_dir/dhelix-diff"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok    $1"; }
fail() { failed=$((failed + 1)); echo "FAIL  $1: $2"; }

# expect NAME STATUS STDERR-SUBSTRING ARGS...: runs dhelix-diff ARGS and checks the exit
# status and (when not empty) that stderr contains the substring.
expect() {
  local name=$1 want=$2 needle=$3
  shift 3
  "$diff_tool" "$@" >"$scratch/stdout" 2>"$scratch/stderr"
  local status=$?
  if [[ $status -ne $want ]]; then
    fail "$name" "exit $status, want $want; stderr: $(head -c 300 "$scratch/stderr")"
  elif [[ -n $needle ]] && ! grep -qF -- "$needle" "$scratch/stderr"; then
    fail "$name" "stderr lacks '$needle': $(head -c 300 "$scratch/stderr")"
  else
    pass "$name (exit $status)"
  fi
}

# stdout_has NAME SUBSTRING: the last run's stdout contains SUBSTRING.
stdout_has() {
  if grep -qF -- "$2" "$scratch/stdout"; then pass "$1"; else fail "$1" "stdout lacks '$2'"; fi
}

# edit_plan IN OUT PYTHON: OUT is IN with PYTHON applied to the parsed plan `p`.
edit_plan() {
  /usr/bin/python3 - "$1" "$2" "$3" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(p, open(sys.argv[2], "w"), indent=2)
PY
}

a="$src_dir/examples/plans/llama-25b-a40-dp8-tp8.json"
slower="$scratch/slower.json"
edit_plan "$a" "$slower" 'p["schemes"][0]["iteration_us"] *= 1.072'
rebuilt="$scratch/rebuilt.json"  # another git hash only: provenance
edit_plan "$a" "$rebuilt" 'p["meta"]["git_hash"] = "0123456789ab"'

# --- 0: nothing failed --------------------------------------------------------------------
expect "same plan" 0 "" "$a" "$a" --fail-if-changed --fail-if-slower 0
stdout_has "same plan says so" "The plans are identical."
expect "provenance only, --fail-if-changed" 0 "" "$a" "$rebuilt" --fail-if-changed
stdout_has "provenance only is reported" "tool.git_hash"
expect "7.2 % slower, --fail-if-slower 8" 0 "" "$a" "$slower" --fail-if-slower 8
stdout_has "slower is summarised" "dhelix is 7.2 % slower on B"
expect "slower without --fail-if" 0 "" "$a" "$slower" --json
if /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["plan_changed"] and d["failures"] == [] else 1)' "$scratch/stdout"; then
  pass "--json is JSON with plan_changed"
else
  fail "--json is JSON with plan_changed" "$(head -c 300 "$scratch/stdout")"
fi

# The V and interleaved stages of one job: the stages' model chunks and the shape differ.
expect "the V vs interleaved stages" 0 "" "$src_dir/examples/plans/tiny-tp2-pp2-v.json" \
  "$src_dir/examples/plans/tiny-tp2-pp2-interleaved.json"
stdout_has "model chunks are compared" 'stage.0.model_chunks         [] -> [{"first":0,"count":1},{"first":2,"count":1}]'
stdout_has "the shape is compared" '"v" -> "interleaved"'

# --- 1: a --fail-if condition met ---------------------------------------------------------
expect "7.2 % slower, --fail-if-slower 5" 1 "dhelix-diff: failed: dhelix iteration time grew 7.2 % (> 5 %)" \
  "$a" "$slower" --fail-if-slower 5
expect "slower, --fail-if-changed" 1 "dhelix-diff: failed: the plans differ" \
  "$a" "$slower" --fail-if-changed
expect "faster never trips --fail-if-slower" 0 "" "$slower" "$a" --fail-if-slower 0

# The golden pair: the same job on the A40 and the H100 cluster.
a40="$src_dir/examples/plans/golden/llama-8b-a40.plan.json"
h100="$src_dir/examples/plans/golden/llama-8b-h100.plan.json"
expect "A40 -> H100 is faster" 0 "" "$a40" "$h100" --fail-if-slower 0
stdout_has "A40 -> H100 names the cluster" 'cluster.name                 "a40" -> "h100"'
expect "A40 -> H100, --fail-if-changed" 1 "dhelix-diff: failed: the plans differ" \
  "$a40" "$h100" --fail-if-changed
expect "H100 -> A40 is slower" 1 "dhelix-diff: failed: dhelix iteration time grew" \
  "$h100" "$a40" --fail-if-slower 5 --fail-if-changed
if [[ $(grep -c "dhelix-diff: failed:" "$scratch/stderr") -eq 2 ]]; then
  pass "both failed conditions are reported"
else
  fail "both failed conditions are reported" "$(cat "$scratch/stderr")"
fi

# --- 2: bad input -------------------------------------------------------------------------
echo '{ not json' >"$scratch/broken.json"
expect "malformed JSON" 2 "broken.json" "$a" "$scratch/broken.json"
edit_plan "$a" "$scratch/unknown.json" 'p["schemez"] = 1'
expect "unknown key" 2 "unknown key" "$a" "$scratch/unknown.json"
expect "bad --fail-if-slower" 2 "" "$a" "$a" --fail-if-slower abc
expect "negative --fail-if-slower" 2 "" "$a" "$a" --fail-if-slower -1
expect "one plan only" 2 "" "$a"

# --- 3: unreadable file -------------------------------------------------------------------
expect "missing file" 3 "$scratch/missing.json" "$a" "$scratch/missing.json"

# --- 5: another major schema version --------------------------------------------------------
sed -E '0,/"schema_version": "1\.[0-9]+\.[0-9]+"/s//"schema_version": "2.0.0"/' "$a" >"$scratch/v2.json"
expect "major version 2" 5 \
  "v2.json: /schema_version: \"2.0.0\" has major version 2, this dhelix reads major version 1 only" \
  "$scratch/v2.json" "$a"

# --- --help documents the exit statuses -----------------------------------------------------
"$diff_tool" --help >"$scratch/stdout" 2>&1
stdout_has "--help lists exit status 5" "5  a plan of another major schema version"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
