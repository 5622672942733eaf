#!/usr/bin/env bash
# An interrupted run never damages what is on disk. dhelix-plan writes a big plan and a big
# Chrome trace (lib/atomic_file.h: each goes to "<target>.tmp.XXXXXX" beside the target, is
# fsync'ed and renamed over it). The test puts an old plan and trace (of a small job) in
# place, starts planning a big job to the same paths and kill -9's it after one of several
# delays spread over its run time, again and again. After every kill each target must be
# either the old file, byte for byte, or a complete new one: valid JSON equal to what an
# uninterrupted run writes, provenance ("meta": date, output path) aside. A temporary file left behind by the kill is allowed: it never stands in a target's
# place, and the next run must still succeed.
#
# Usage: kill_write_test.sh <dir-with-binaries> <source-dir>
set -u

bin_dir=$(cd "$1" && pwd)
src_dir=$(cd "$2" && pwd)
job="$src_dir/examples/jobs/llama-39b-a40-dp2-tp8-cp2-pp2-seq16k.json"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok    $1"; }
fail() { failed=$((failed + 1)); echo "FAIL  $1: $2"; }

# Whether two JSON files are equal once their provenance blocks ("meta") are dropped.
same_but_meta() {
  /usr/bin/python3 -c 'import json, sys
def load(path):
    doc = json.load(open(path))
    if isinstance(doc, dict):
        doc.pop("meta", None)
    return doc
sys.exit(0 if load(sys.argv[1]) == load(sys.argv[2]) else 1)' "$1" "$2" 2>/dev/null
}

old_job="$src_dir/examples/jobs/llama-8b-a40-dp16-tp4.json"
plan_cmd=("$bin_dir/dhelix-plan" "$job" -o out.json --trace trace.json)

# The old files, from a small job, and the new ones as an uninterrupted run writes them.
if ! "$bin_dir/dhelix-plan" "$old_job" -o old-out.json --trace old-trace.json >/dev/null 2>err.txt; then
  fail "writing the old files" "$(cat err.txt)"
  echo "$passed passed, $failed failed"
  exit 1
fi
start_ns=$(date +%s%N)
if ! "${plan_cmd[@]}" >/dev/null 2>err.txt; then
  fail "an uninterrupted run" "$(cat err.txt)"
  echo "$passed passed, $failed failed"
  exit 1
fi
run_ms=$((($(date +%s%N) - start_ns) / 1000000))
mv out.json new-out.json
mv trace.json new-trace.json
echo "note  one run takes ${run_ms} ms; it writes out.json of $(stat -c %s new-out.json) bytes" \
  "and trace.json of $(stat -c %s new-trace.json) bytes"

# Kill points: fractions of one run's time, denser near the end where the files are written.
for percent in 20 50 80 90 95 98 100 103; do
  cp old-out.json out.json
  cp old-trace.json trace.json
  delay_ms=$((run_ms * percent / 100))
  "${plan_cmd[@]}" >/dev/null 2>&1 &
  pid=$!
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  temps=$(ls -A | grep -c '\.tmp\.' || true)
  states=""
  ok=1
  for target in out.json trace.json; do
    if cmp -s "$target" "old-$target"; then
      states+=" $target old"
    elif same_but_meta "$target" "new-$target"; then
      states+=" $target new"
    else
      fail "kill -9 at ${percent}% (${delay_ms} ms)" "$target is neither the old nor the new file"
      ok=0
    fi
  done
  [[ $ok -eq 1 ]] && pass "kill -9 at ${percent}% (${delay_ms} ms):${states}; ${temps} temporary file(s) in total"
done

# Leftover temporaries carry the target's name plus ".tmp." and six random characters; they
# never match the target name, so the next run neither reads nor trips over them.
leftovers=$(ls -A | grep '\.tmp\.' || true)
if [[ -n $leftovers ]]; then
  bad_names=$(echo "$leftovers" | grep -Ev '^(out|trace)\.json\.tmp\.[A-Za-z0-9]{6}$' || true)
  if [[ -n $bad_names ]]; then
    fail "leftover temporary names" "unexpected: $bad_names"
  else
    pass "leftover temporaries are named <target>.tmp.XXXXXX: $(echo "$leftovers" | wc -l) left"
  fi
else
  pass "no temporary file left behind"
fi

# The run after all those kills still works and writes the new files.
if "${plan_cmd[@]}" >/dev/null 2>err.txt && same_but_meta out.json new-out.json &&
  same_but_meta trace.json new-trace.json; then
  pass "a run after the kills writes the same files"
else
  fail "a run after the kills writes the same files" "$(cat err.txt)"
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
