#!/usr/bin/env bash
# Regression tests of docs/reliability.md's table "Nothing lost, nothing silently wrong":
# each case below was a data loss, a crash or a silently wrong result, and each check fails
# on the code before its fix. Runs the real binaries on a one-rank tiny job (dhelix-run
# starts as an MPI singleton, no mpirun needed).
#
# Usage: reliability_test.sh BIN_DIR SOURCE_DIR
set -u
bin=$(cd "${1:?usage: reliability_test.sh BIN_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: reliability_test.sh BIN_DIR SOURCE_DIR}" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
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
pass() { passed=$((passed + 1)); echo "ok    $1"; }
fail() {
  failed=$((failed + 1))
  echo "FAIL  $1: $2"
  echo "      stdout: ${out:0:600}"
  echo "      stderr: ${err:0:600}"
}
# expect NAME STATUS [--err TEXT]... [--out TEXT]... [--no-out TEXT]...
expect() {
  local name=$1 want=$2
  shift 2
  if [[ $status -ne $want ]]; then
    fail "$name" "exit status $status, expected $want"
    return
  fi
  while [[ $# -gt 0 ]]; do
    case $1 in
      --err) [[ $err == *"$2"* ]] || { fail "$name" "stderr lacks: $2"; return; } ;;
      --out) [[ $out == *"$2"* ]] || { fail "$name" "stdout lacks: $2"; return; } ;;
      --no-out) [[ $out != *"$2"* ]] || { fail "$name" "stdout has: $2"; return; } ;;
    esac
    shift 2
  done
  pass "$name"
}
# edit_json IN OUT PYTHON: OUT is IN with the Python statement applied to `d`.
edit_json() {
  python3 -c "import json, sys
d = json.load(open(sys.argv[1]))
$3
json.dump(d, open(sys.argv[2], 'w'), indent=1)" "$1" "$2"
}

plan_tool="$bin/dhelix-plan"
mkdir -p jobs
sed -e 's/"tp": 2/"tp": 1/' -e 's/"sp": true/"sp": false/' -e 's|\.\./|'"$src"'/examples/|g' "$src/examples/jobs/tiny-tp2.json" \
  >jobs/job.json
cp jobs/job.json job-copy.json
head -c 300000 "$src/examples/data/corpus.txt" >corpus.txt
"$plan_tool" jobs/job.json -o plan.json >/dev/null || { echo "setup: planning failed"; exit 1; }
"$bin/dhelix-profile" jobs/job.json -o profile.json >/dev/null || { echo "setup failed"; exit 1; }
train=("$bin/dhelix-run" --plan plan.json --data corpus.txt --no-progress)

# --- data loss -------------------------------------------------------------------------------
run "$plan_tool" jobs/job.json -o jobs/job.json
expect "-o equal to the job" 2 --err "-o jobs/job.json: is the input"
cmp -s jobs/job.json job-copy.json || fail "-o equal to the job" "the job changed"
run "$plan_tool" jobs/job.json --profile profile.json -o profile.json
expect "-o equal to --profile" 2 --err "is the input --profile"
run "$plan_tool" jobs/job.json -o x.json --trace x.json
expect "-o and --trace on one file" 2 --err "--trace x.json: is also the output of -o"
run "$bin/dhelix-profile" jobs/job.json -o jobs/job.json
expect "dhelix-profile -o equal to the job" 2 --err "is the input"
cmp -s jobs/job.json job-copy.json || fail "dhelix-profile -o job" "the job changed"
for device in /dev/null /dev/full; do
  run "$plan_tool" jobs/job.json -o "$device"
  [[ -c $device ]] || fail "-o $device" "$device is no longer a character device"
done
[[ $status -eq 3 && $err == *"No space left on device"* ]] && pass "-o /dev/full: exit 3" ||
  fail "-o /dev/full" "exit $status"
cp plan.json plan-copy.json
run "${train[@]}" --steps 1 --loss-log plan.json
expect "--loss-log equal to the plan" 2 --err "is the input --plan"
run "${train[@]}" --steps 1 --loss-log corpus.txt
expect "--loss-log equal to the data" 2 --err "is the input --data"
run "${train[@]}" --steps 1 --loss-log profile.json
expect "--loss-log on another JSON file" 2 --err "is not a loss log"
cmp -s plan.json plan-copy.json || fail "--loss-log" "the plan changed"

# --- crash --------------------------------------------------------------------------------------
run "$bin/dhelix-run" --plan plan.json --data /tmp --steps 1
expect "--data a directory" 3 --err "/tmp: is a directory, expected a text file"

# --- silently wrong: the plan checker -------------------------------------------------------------
for n in 5 400; do
  edit_json plan.json "mb$n.json" "d['num_micro_batches'] = $n"
  run "$plan_tool" --check "mb$n.json"
  expect "--check: num_micro_batches 2 -> $n" 2 --err "/num_micro_batches: $n differs from the job"
  run "$bin/dhelix-run" --plan "mb$n.json" --job jobs/job.json --data corpus.txt --steps 1
  expect "dhelix-run: num_micro_batches 2 -> $n" 2 --err "/num_micro_batches"
done
edit_json plan.json dropped-mb.json "s = d['stages'][0]; s['tasks'] = [t for t in s['tasks'] if not (t.get('forward') or {}).get('micro_batch') == 1 and not (t.get('backward') or {}).get('micro_batch') == 1 and t.get('head_loss_micro_batch') != 1]
for i, t in enumerate(s['tasks']): t['index'] = i"
run "$plan_tool" --check dropped-mb.json
expect "--check: a micro-batch's tasks removed" 2 --err "micro-batch 1"
edit_json plan.json reordered.json "p = d['pairings'][0]
b = next(b for k in ('layer_blocks', 'window_blocks') for b in p[k] if len(b['backward_ops']) > 1)
b['backward_ops'] = b['backward_ops'][::-1]"
run "$plan_tool" --check reordered.json
expect "--check: ops reordered inside a block" 2 --err "differs from the block's"
edit_json plan.json dropped-op.json "p = d['pairings'][0]
for k in ('layer_blocks', 'window_blocks', 'remainder_blocks'):
    for b in p[k]:
        b['timings'] = [t for t in b['timings'] if not t['op'].endswith('bwd.fc1_wgrad')]
        b['backward_ops'] = [o for o in b['backward_ops'] if not o.endswith('bwd.fc1_wgrad')]"
run "$plan_tool" --check dropped-op.json
expect "--check: a weight-gradient op dropped from a block" 2 --err "less often than the sequential one"

# waits_for needs two stages: the shipped TP2 x PP2 plan.
edit_json "$src/examples/plans/tiny-tp2-pp2.json" no-waits.json "t = next(t for t in d['stages'][1]['tasks'] if t['waits_for']); t['waits_for'] = []"
run "$plan_tool" --check no-waits.json
expect "--check: a task's waits_for deleted" 2 --err "differs from the transfers the task receives"

# --- silently wrong: divergence ------------------------------------------------------------------------
# 2 good steps with checkpoints, then a resume with a wild --lr: the first non-finite loss
# stops the run naming the step and micro-batch, and `latest` names a checkpoint that trains.
for lr in nan 1e30; do
  rm -rf "ck-$lr"
  run "${train[@]}" --steps 2 --checkpoint-dir "ck-$lr" --checkpoint-every 1
  run "${train[@]}" --steps 8 --checkpoint-dir "ck-$lr" --checkpoint-every 2 --resume --lr "$lr"
  expect "--lr $lr stops naming the step and micro-batch" 1 \
    --err "training diverged at step" --err "micro-batch 0: the loss is"
  last=$(cat "ck-$lr/latest" 2>/dev/null)
  run "${train[@]}" --steps $((${last#step-} + 1)) --checkpoint-dir "ck-$lr" --resume
  expect "--lr $lr: the checkpoint left as latest ($last) trains" 0
done
# An update that makes the weights non-finite is never checkpointed.
run "${train[@]}" --steps 4 --checkpoint-dir ck-nan --checkpoint-every 1 --resume --lr nan
expect "--lr nan: no checkpoint of non-finite weights" 1 --err "its checkpoint was not written"
[[ ! -e ck-nan/step-4 ]] || fail "--lr nan" "step-4 was written"

# --- silently wrong: flags ---------------------------------------------------------------------------------
run "$bin/dhelix-diff" plan.json plan.json --fail-if-slower nan
expect "--fail-if-slower nan" 2 --err '"nan" is not a percentage'
run "$bin/dhelix-diff" plan.json plan.json --fail-if-slower -1
expect "--fail-if-slower -1 in a short message" 2 --err "at least 0"
[[ ${#err} -lt 300 ]] || fail "--fail-if-slower -1" "a long message"
printf '{"schema_version": "1.0.0", "name": "d", "model": "%s", "cluster": "%s",\n "parallel": {"tp": 1, "tp": 8, "micro_batch_size": 2, "global_batch_size": 4, "seq_length": 64}}\n' \
  "$src/examples/models/llama-tiny.json" "$src/examples/clusters/cpu-host.json" >dup.json
run "$plan_tool" dup.json --validate-only
expect "a duplicate key" 2 --err "dup.json:2:24: /parallel/tp: duplicate key (first at line 2, column 15)"
rm -rf resumed
run "${train[@]}" --steps 3 --checkpoint-dir resumed
run "${train[@]}" --steps 2 --checkpoint-dir resumed --resume
expect "--resume with fewer --steps than the checkpoint" 2 --err "is at step 3 already"
run "$plan_tool" jobs/job.json --sp --no-sp --validate-only
expect "--sp --no-sp" 2 --err "excludes"
run "$plan_tool" --check plan.json jobs/job.json -o y.json
expect "--check with a job and -o" 2 --err "--check reads a plan only: JOB, -o are not used"
run "$plan_tool" jobs/job.json --validate-only -o y.json
expect "--validate-only -o" 2 --err "--validate-only writes and prints no plan: -o is not used"
run "$plan_tool" jobs/job.json --json -o y.json
expect "--json without --validate-only" 2 --err "--json applies to --validate-only only"
[[ ! -e y.json ]] || fail "inert flags" "y.json was written"
run "${train[@]}" --steps 1 --checkpoint-every 1
expect "--checkpoint-every without a directory" 2 --err "--checkpoint-every needs --checkpoint-dir"

# --- poor handling -----------------------------------------------------------------------------------------
touch not-a-dir
run "${train[@]}" --steps 1 --checkpoint-dir not-a-dir
expect "--checkpoint-dir a file, found at start" 3 --err "is not a directory" --no-out "step"
run "${train[@]}" --steps 1 --checkpoint-dir not-a-dir/sub
expect "--checkpoint-dir under a file" 3 --err "--checkpoint-dir not-a-dir/sub"
run "$plan_tool" --check jobs/job.json
expect "--check job.json" 2 --err "jobs/job.json: this is a job file, not a plan"
[[ $(wc -l <stderr.txt) -le 2 ]] || fail "--check job.json" "more than one line"
run "$plan_tool" jobs/job.json --profile plan.json
expect "a plan as --profile" 2 --err "plan.json: this is a plan, not a profile"
run "$plan_tool" plan.json --validate-only
expect "a plan as the job" 2 --err "plan.json: this is a plan, not a job file"
run "$bin/dhelix-run" --plan jobs/job.json --data corpus.txt --steps 1
expect "a job as --plan" 2 --err "this is a job file, not a plan"
run "$bin/dhelix-run" --plan plan.json --data /dev/zero --steps 1
expect "--data /dev/zero" 3 --err "is not a regular file"
cp plan.json old-plan.json
run "$plan_tool" jobs/job.json -o old-plan.json --trace /dev/full --svg pics
expect "outputs fail together" 3 --err "/dev/full"
cmp -s plan.json old-plan.json || fail "outputs fail together" "the plan was replaced"
[[ ! -e pics-pipeline.svg ]] || fail "outputs fail together" "a picture was written"
run "$plan_tool" "$src/examples/jobs/tiny-tp2.json" --profile profile.json
expect "a profile of another job, in a few lines" 2 --err "profile this job into a new file"
[[ $(wc -l <stderr.txt) -le 8 ]] || fail "profile of another job" "$(wc -l <stderr.txt) lines"

# SIGTERM mid-run: the step finishes, a checkpoint is written, the run says so, exit 143.
rm -rf sig
"${train[@]}" --steps 100000 --checkpoint-dir sig >sig.out 2>sig.err &
pid=$!
for _ in $(seq 1 600); do
  [[ -s sig.out ]] && grep -q "dhelix-run:" sig.out && break
  sleep 0.1
done
sleep 1
kill -TERM "$pid"
wait "$pid"
status=$?
out=$(cat sig.out)
err=$(cat sig.err)
expect "SIGTERM: checkpoint, message, exit 143" 143 --err "stopped by SIGTERM after step" \
  --err "written; continue with --resume"
[[ -f sig/$(cat sig/latest 2>/dev/null)/manifest.json ]] || fail "SIGTERM" "no checkpoint"

echo "$passed passed, $failed failed"
((failed == 0))
