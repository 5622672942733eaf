#!/usr/bin/env bash
# End-to-end tests of dhelix-plan --check (docs/plan-check.md).
# Usage: check_test.sh <dir-with-binaries> <source-dir>
# Every shipped plan passes (exit 0, the one-line summary, with its time); corrupted plans
# exit 2 with the problem named on stderr. The last line is "N passed, M failed".
set -u

bin_dir=$(cd "$1" && pwd)
src_dir=$(cd "$2" && pwd)
plan="$bin_dir/dhelix-plan"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok    $1"; }
fail() { failed=$((failed + 1)); echo "FAIL  $1: $2"; }

# --- every shipped plan passes ------------------------------------------------------------
for file in "$src_dir"/examples/plans/*.json "$src_dir"/examples/plans/golden/*.json; do
  name=${file#"$src_dir"/}
  start=$(date +%s.%N)
  (cd "$src_dir" && "$plan" --check "$name") >"$scratch/stdout" 2>"$scratch/stderr"
  status=$?
  seconds=$(awk -v end="$(date +%s.%N)" -v start="$start" 'BEGIN { printf "%.2f", end - start }')
  if [[ $status -eq 0 ]] && grep -q "^$name: ok: .* no wait cycle, memory fits" "$scratch/stdout"; then
    pass "$(cat "$scratch/stdout") (${seconds} s)"
  else
    fail "$name" "exit $status: $(head -c 600 "$scratch/stdout" "$scratch/stderr")"
  fi
done

# corrupt NAME PYTHON: writes $scratch/NAME.json from tiny-tp2-pp2 edited by PYTHON (on `p`)
corrupt() {
  /usr/bin/python3 - "$src_dir/examples/plans/tiny-tp2-pp2.json" "$scratch/$1.json" "$2" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(p, open(sys.argv[2], "w"), indent=2)
PY
}

# expect_refusal NAME TEXT: --check exits 2 and stderr holds TEXT
expect_refusal() {
  (cd "$scratch" && "$plan" --check "$1.json") >"$scratch/stdout" 2>"$scratch/stderr"
  status=$?
  if [[ $status -ne 2 ]]; then
    fail "$1" "exit $status, expected 2: $(head -c 400 "$scratch/stderr")"
  elif ! grep -qF -- "$2" "$scratch/stderr"; then
    fail "$1" "stderr lacks '$2': $(head -c 600 "$scratch/stderr")"
  else
    pass "$1 refused: $(grep -F -- "$2" "$scratch/stderr" | head -n 1 | cut -c1-160)..."
  fi
}

# --- a wait cycle: stage 0 waits for micro-batch 0 before sending micro-batch 1, stage 1
# --- waits for micro-batch 1 before sending micro-batch 0
corrupt cycle '
s0 = p["stages"][0]["tasks"]; s0[1], s0[2] = s0[2], s0[1]
s1 = p["stages"][1]["tasks"]; s1[0:4] = s1[2:4] + s1[0:2]'
expect_refusal cycle "dhelix-plan: error: cycle.json: /stages/0/tasks/1: co-executed: deadlock: 1166 of 1200 instructions never run; wait cycle: rank 0 stage 0 task 2 (F0u): p2p.activation, layer 3, micro-batch 0 [receive stream] waits for its send rank 2"

# --- memory over budget, and the same plan made with --allow-oom (a warning only) ----------
# A plan that does not fit, made by the planner (the checker recomputes the budget and the
# stages' memory, check 11, so an edited budget is another refusal): tiny-tp2-pp2's job on
# a cpu-host with 2261000000 bytes (466352 usable), written with --allow-oom; oom.json is
# the same plan with the flag cleared. No shape fits, so auto takes the one needing the least:
# interleaved stages without SI blocks (planner/dhelix_shapes.h).
/usr/bin/python3 - "$src_dir" "$scratch" <<'PY'
import json, sys
src, scratch = sys.argv[1:3]
cluster = json.load(open(f"{src}/examples/clusters/cpu-host.json"))
cluster["gpu"]["memory_bytes"] = 2261000000
json.dump(cluster, open(f"{scratch}/small.json", "w"))
job = json.load(open(f"{src}/examples/jobs/tiny-tp2-pp2.json"))
job["model"] = f"{src}/examples/models/llama-tiny.json"
job["cluster"] = "small.json"
json.dump(job, open(f"{scratch}/job-small.json", "w"))
PY
(cd "$scratch" && "$plan" job-small.json --allow-oom -o oom-allowed.json >/dev/null 2>&1) ||
  fail "oom setup" "dhelix-plan --allow-oom wrote no plan"
/usr/bin/python3 -c 'import json, sys
p = json.load(open(sys.argv[1])); p["options"]["allow_oom"] = False
json.dump(p, open(sys.argv[2], "w"), indent=2)' "$scratch/oom-allowed.json" "$scratch/oom.json"
expect_refusal oom "dhelix-plan: error: oom.json: /schemes/0/memory/0: stage 0 needs 1.9 MiB (1971200 bytes"
corrupt budget 'p["memory_budget"]["usable_bytes"] = 2000000'
expect_refusal budget "dhelix-plan: error: budget.json: /memory_budget/usable_bytes: 2000000 differs from 1932735283 bytes recomputed from the plan's own /job"
(cd "$scratch" && "$plan" --check oom-allowed.json) >"$scratch/stdout" 2>"$scratch/stderr"
status=$?
if [[ $status -eq 0 ]] && grep -q "^dhelix-plan: warning: oom-allowed.json: /schemes/0/memory/0: stage 0 needs" "$scratch/stderr" &&
  grep -q "memory over budget (--allow-oom)" "$scratch/stdout"; then
  pass "oom-allowed passes with a warning"
else
  fail "oom-allowed" "exit $status: $(cat "$scratch/stdout" "$scratch/stderr" | head -c 600)"
fi

# --- a task list that uses a layer's input before it exists -------------------------------
corrupt use-before-def '
s1 = p["stages"][1]["tasks"]; s1[0], s1[1] = s1[1], s1[0]'
expect_refusal use-before-def "co-executed: rank 2 does not lower: plan: stage 1 task 1: layer 2's input for micro-batch 0 is used before it is produced"

# --- the V (examples/plans/tiny-tp2-pp2-v.json) with its last weight part removed: the input
# --- part's layers would get no gradient
/usr/bin/python3 - "$src_dir/examples/plans/tiny-tp2-pp2-v.json" "$scratch/v-no-w.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
assert p["schemes"][0]["shape"] == "v", "tiny-tp2-pp2-v is no longer planned as the V"
tasks = p["stages"][1]["tasks"]
assert tasks[-1]["label"].startswith("W"), tasks[-1]["label"]
tasks.pop()
json.dump(p, open(sys.argv[2], "w"), indent=2)
PY
expect_refusal v-no-w "the input part (I) has no weight part (W) later on the stage"

# --- interleaved stages (examples/plans/tiny-tp2-pp2-interleaved.json): stage 0's second model
# --- chunk moved onto layer 1, which stage 1 holds: both stages would own it
/usr/bin/python3 - "$src_dir/examples/plans/tiny-tp2-pp2-interleaved.json" "$scratch/il-chunk.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
assert p["schemes"][0]["shape"] == "interleaved", "tiny-tp2-pp2-interleaved is not interleaved"
s0 = p["stages"][0]
assert s0["model_chunks"] == [{"first": 0, "count": 1}, {"first": 2, "count": 1}], s0["model_chunks"]
s0["model_chunks"][1]["first"] = 1
for t in s0["tasks"]:
    for part in (t["forward"], t["backward"]):
        if part and part.get("model_chunk") == 1:
            part["layers"]["first"] = 1
json.dump(p, open(sys.argv[2], "w"), indent=2)
PY
expect_refusal il-chunk "no stage holds layer 2"
# --- and a task part naming a model chunk the stage lacks
/usr/bin/python3 - "$src_dir/examples/plans/tiny-tp2-pp2-interleaved.json" "$scratch/il-part.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["stages"][1]["tasks"][0]["forward"]["model_chunk"] = 2
json.dump(p, open(sys.argv[2], "w"), indent=2)
PY
expect_refusal il-part "/stages/1/tasks/0/forward/model_chunk: 2 must name one of the stage's 2 model_chunks (0..1)"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
