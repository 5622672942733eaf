#!/usr/bin/env bash
# Cross-checks of issue 37 (docs/reliability.md, "Hardening 3: sizes, search, cross-checks"),
# through the real binaries; each check fails on the code before its fix:
#   1. absurd sizes: every integer parallel setting of a job file (taken from
#      schemas/job.schema.json), every sizing field of a plan and every size of a plan's job
#      at 2^62: exit 2 naming the file, the pointer, the value and the maximum, from
#      dhelix-plan, dhelix-plan --check, --search, dhelix-run and dhelix-diff; never
#      "internal error" (std::bad_alloc);
#   2. --search with nothing to enumerate (--gpus 7 for a global batch of 4) or more GPUs
#      than a one-node cluster has: exit 2 saying so, not "none fits in memory";
#   3. dhelix-plan --check recomputes the memory budget, every stage's memory and the op
#      signatures from the plan's own job: an out-of-memory plan whose figures were edited
#      fails, naming the field, the value in the file and the recomputed one;
#   4. traces carry the plan's identity: dhelix-diff --measured and dhelix-profile
#      --from-trace refuse a trace of the sequence-256 plan with the sequence-64 one, naming
#      both hashes and /parallel/seq_length; a trace without an identity (older dhelix-run)
#      is read with a warning.
# Usage: cross_check_test.sh BIN_DIR SOURCE_DIR
set -u
bin=$(cd "${1:?usage: cross_check_test.sh BIN_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: cross_check_test.sh BIN_DIR SOURCE_DIR}" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

passed=0
failed=0
status=0
out=""
err=""
run() {
  timeout 300 "$@" >stdout.txt 2>stderr.txt
  status=$?
  out=$(cat stdout.txt)
  err=$(cat stderr.txt)
}
pass() { passed=$((passed + 1)); }
fail() {
  failed=$((failed + 1))
  echo "FAIL  $1: $2"
  echo "      stdout: ${out:0:600}"
  echo "      stderr: ${err:0:600}"
}
# expect NAME STATUS [--err TEXT]... [--out TEXT]...: also never an internal error.
expect() {
  local name=$1 want=$2
  shift 2
  if [[ $status -ne $want ]]; then
    fail "$name" "exit status $status, expected $want"
    return
  fi
  if [[ $err == *"internal error"* ]]; then
    fail "$name" "internal error"
    return
  fi
  while [[ $# -gt 0 ]]; do
    case $1 in
      --err) [[ $err == *"$2"* ]] || { fail "$name" "stderr lacks: $2"; return; } ;;
      --out) [[ $out == *"$2"* ]] || { fail "$name" "stdout lacks: $2"; return; } ;;
    esac
    shift 2
  done
  pass
  echo "ok    $name"
}
# edit_json IN OUT PYTHON: OUT is IN with the Python statements applied to `d`.
edit_json() {
  python3 -c "import json, sys
d = json.load(open(sys.argv[1]))
$3
json.dump(d, open(sys.argv[2], 'w'), indent=1)" "$1" "$2"
}

plan_tool="$bin/dhelix-plan"
job=$src/examples/jobs/tiny-tp2.json
huge=4611686018427387904 # 2^62
head -c 200000 "$src/examples/data/corpus.txt" >corpus.txt
"$plan_tool" "$job" -o p64.json >/dev/null || { echo "setup: planning failed"; exit 1; }
"$plan_tool" "$job" --seq 256 -o p256.json >/dev/null || { echo "setup: planning failed"; exit 1; }

# --- 1. absurd sizes ---------------------------------------------------------------------------
# Every integer setting of the parallel object, from the schema (a new one is covered).
mapfile -t settings < <(python3 -c "import json, sys
s = json.load(open(sys.argv[1]))['properties']['parallel']['properties']
for k, v in s.items():
    if v.get('type') == 'integer': print(k, v['maximum'])" "$src/schemas/job.schema.json")
[[ ${#settings[@]} -ge 12 ]] || fail "schema settings" "only ${#settings[@]} integer settings"
for entry in "${settings[@]}"; do
  key=${entry% *}
  max=${entry#* }
  edit_json "$job" job-huge.json "
d['model'] = '$src/examples/models/llama-tiny.json'; d['cluster'] = '$src/examples/clusters/cpu-host.json'
d['parallel']['$key'] = $huge"
  run "$plan_tool" job-huge.json -o out.json
  expect "job /parallel/$key = 2^62" 2 --err "job-huge.json: /parallel/$key: $huge must be at most $max"
  [[ ! -e out.json ]] || fail "job /parallel/$key = 2^62" "wrote out.json"
  run "$plan_tool" job-huge.json --search --gpus 2
  expect "--search, job /parallel/$key = 2^62" 2 --err "/parallel/$key: $huge must be at most $max"
done
# A plan's own fields that size or index what its readers build.
for pointer in /num_micro_batches /pairings/0/chunk_layers /stages/0/down_layers/count \
  /stages/0/tasks/0/forward/micro_batch /stages/0/tasks/0/index /stages/0/shape_rank; do
  edit_json p64.json plan-huge.json "
import functools
keys = [int(k) if k.isdigit() else k for k in '$pointer'.split('/')[1:]]
functools.reduce(lambda o, k: o[k], keys[:-1], d)[keys[-1]] = $huge"
  run "$plan_tool" --check plan-huge.json
  expect "plan $pointer = 2^62: --check" 2 --err "plan-huge.json: $pointer: $huge must be at most"
  run "$bin/dhelix-diff" plan-huge.json p64.json
  expect "plan $pointer = 2^62: dhelix-diff" 2 --err "$pointer: $huge must be at most"
done
# The plan's job (and its copy in /inputs), through every tool that reads plans.
edit_json p64.json plan-gbs.json "
d['job']['parallel']['global_batch_size'] = $huge; d['inputs']['parallel']['global_batch_size'] = $huge"
run "$plan_tool" --check plan-gbs.json
expect "plan's job global batch 2^62: --check" 2 --err "/parallel/global_batch_size: $huge must be at most"
run mpirun --allow-run-as-root --oversubscribe -np 2 "$bin/dhelix-run" --plan plan-gbs.json \
  --data corpus.txt --steps 1 --no-progress
expect "plan's job global batch 2^62: dhelix-run" 2 --err "/parallel/global_batch_size: $huge must be at most"

# Sizes each within bounds whose product exhausts memory: 524288 micro-batches of the tiny
# job (std::bad_alloc within 4 GB before) are refused by the job's rules, and the same
# batch in a plan's job when the plan is read. (Under a 4 GB address-space limit, so that
# the code before the fix fails instead of swapping the machine.)
limited=(bash -c 'ulimit -v 4000000; exec "$@"' limited)
run "${limited[@]}" "$plan_tool" "$job" --gbs 1048576 -o big.json
expect "524288 micro-batches" 2 \
  --err "--gbs: 1048576 gives 524288 micro-batches on pp = 1 stages = 524288 pipeline tasks; at most 131072"
[[ ! -e big.json ]] || fail "524288 micro-batches" "wrote big.json"
edit_json p64.json plan-passes.json "
d['job']['parallel']['global_batch_size'] = 1048576; d['inputs']['parallel']['global_batch_size'] = 1048576"
run "${limited[@]}" "$plan_tool" --check plan-passes.json
expect "a plan's job of 524288 micro-batches: --check" 2 --err "pipeline tasks; at most 131072"

# --- 2. the search says what happened ----------------------------------------------------------
run "$plan_tool" "$job" --search --gpus 7
expect "--search --gpus 7" 2 --err "--gpus: 7: no parallel configuration to search: 7 GPUs: " \
  --err "divides global batch 4"
[[ $out != *"none fits in memory"* ]] || fail "--search --gpus 7" "says none fits in memory"
run "$plan_tool" "$job" --search --gpus 1000000
expect "--search --gpus 1000000, one-node cluster" 2 \
  --err "--gpus: 1000000 is more GPUs than cluster cpu-host has (1 node x 8 GPUs = 8)"
run "$plan_tool" "$job" --search --gpus 8 --tp 8
expect "--search, every configuration breaks a rule" 0 --out "breaks a rule of the job"
[[ $out != *"none fits in memory"* ]] || fail "every configuration breaks a rule" "says none fits in memory"

# --- 3. the checker recomputes what it can -----------------------------------------------------
# An out-of-memory plan (466352 usable bytes; a stage needs about 2 MB), written with
# --allow-oom, then edited to look as if it fit.
edit_json "$src/examples/clusters/cpu-host.json" small.json "d['gpu']['memory_bytes'] = 2261000000"
edit_json "$job" job-small.json "
d['model'] = '$src/examples/models/llama-tiny.json'; d['cluster'] = 'small.json'"
"$plan_tool" job-small.json --allow-oom -o oom.json >/dev/null 2>&1 || fail "OOM plan" "not written"
run "$plan_tool" --check oom.json
expect "the OOM plan itself (--allow-oom)" 0 --err "the plan was made with --allow-oom"
edit_json oom.json oom-budget.json "
d['options']['allow_oom'] = False
d['memory_budget']['usable_bytes'] = d['memory_budget']['capacity_bytes']
for s in d['schemes']: s['fits'] = True"
run "$plan_tool" --check oom-budget.json
expect "OOM plan with an edited budget" 2 \
  --err "oom-budget.json: /memory_budget/usable_bytes: 2261000000 differs from 466352 bytes recomputed from the plan's own /job"
[[ $out != *"memory fits"* ]] || fail "OOM plan with an edited budget" "says memory fits"
edit_json oom.json oom-stages.json "
d['options']['allow_oom'] = False
for s in d['schemes']:
    s['fits'] = True
    for m in s['memory']:
        m['activation_bytes'] = 0; m['weight_bytes'] = m['gradient_bytes'] = m['optimizer_bytes'] = 1; m['total_bytes'] = 3"
run "$plan_tool" --check oom-stages.json
expect "OOM plan with edited stage figures" 2 --err "/memory/0/total_bytes: 3 differs from" \
  --err "/fits: true differs from false"
edit_json p64.json signature.json "d['pairings'][0]['forward_ops'][0]['signature'] = 'gemm:bf16:m=1,n=1,k=1'"
run "$plan_tool" --check signature.json
expect "an edited op signature" 2 --err "/pairings/0/forward_ops/0/signature: \"gemm:bf16:m=1,n=1,k=1\" differs from"
run mpirun --allow-run-as-root --oversubscribe -np 2 "$bin/dhelix-run" --plan oom-budget.json \
  --data corpus.txt --steps 1 --no-progress
expect "dhelix-run refuses the edited budget" 2 --err "/memory_budget/usable_bytes"

# --- 4. traces carry the plan's identity -------------------------------------------------------
for seq in 64 256; do
  run mpirun --allow-run-as-root --oversubscribe -np 2 "$bin/dhelix-run" --plan "p$seq.json" \
    --data corpus.txt --steps 2 --no-progress --trace "t$seq.json"
  expect "dhelix-run --trace (sequence $seq)" 0
done
run "$bin/dhelix-diff" p64.json --measured t256.json
expect "dhelix-diff: the sequence-256 trace with the sequence-64 plan" 2 \
  --err "t256.json: /otherData/plan_identity/sha256: " --err "was measured with another plan" \
  --err "first difference: /parallel/seq_length: 256 vs 64"
run "$bin/dhelix-diff" p64.json --measured t64.json
expect "dhelix-diff: the plan's own trace" 0 --out "iteration"
"$bin/dhelix-profile" "$job" -o base.json >/dev/null 2>&1 || fail "base profile" "not written"
run "$bin/dhelix-profile" "$job" --from-trace t256.json --base base.json -o from-trace.json
expect "dhelix-profile --from-trace: the sequence-256 trace for the sequence-64 job" 2 \
  --err "first difference: /parallel/seq_length: 256 vs 64"
[[ ! -e from-trace.json ]] || fail "--from-trace of another plan" "wrote a profile"
run "$bin/dhelix-profile" "$job" --from-trace t64.json --base base.json -o from-trace.json
expect "dhelix-profile --from-trace: the job's own trace" 0
# A trace written before identities: read, with a warning saying what was not checked.
edit_json t64.json old.json "del d['otherData']['plan_identity']"
run "$bin/dhelix-diff" p64.json --measured old.json
expect "an older trace: dhelix-diff warns" 0 --err "warning: old.json: /otherData/plan_identity: absent"
run "$bin/dhelix-profile" "$job" --from-trace old.json --base base.json -o old-profile.json
expect "an older trace: dhelix-profile warns" 0 --err "warning: old.json: /otherData/plan_identity: absent"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
