#!/usr/bin/env bash
# End-to-end tests of the command-line tools on the shipped examples.
# Usage: cli_test.sh <dir-with-binaries> <source-dir>
# Each check prints "ok" or "FAIL" with what differed; the last line is "N passed, M failed"
# and the exit status is non-zero when anything failed.
set -u

bin_dir=$(cd "$1" && pwd)
src_dir=$(cd "$2" && pwd)
examples="$src_dir/examples"
plan="$bin_dir/dhelix-plan"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

passed=0
failed=0
out=""
err=""
status=0

# run CMD...: runs a command, keeping stdout, stderr and exit status for the checks below.
run() {
  "$@" >"$scratch/stdout" 2>"$scratch/stderr"
  status=$?
  out=$(cat "$scratch/stdout")
  err=$(cat "$scratch/stderr")
}

pass() { passed=$((passed + 1)); echo "ok    $1"; }
fail() {
  failed=$((failed + 1))
  echo "FAIL  $1: $2"
  echo "      stdout: ${out:0:400}"
  echo "      stderr: ${err:0:400}"
}

# expect NAME STATUS [--out TEXT]... [--err TEXT]... [--err-is TEXT] [--no-out TEXT]
expect() {
  local name=$1 want_status=$2
  shift 2
  if [[ $status -ne $want_status ]]; then
    fail "$name" "exit status $status, expected $want_status"
    return
  fi
  while [[ $# -gt 0 ]]; do
    case $1 in
      --out) [[ $out == *"$2"* ]] || { fail "$name" "stdout lacks: $2"; return; } ;;
      --no-out) [[ $out != *"$2"* ]] || { fail "$name" "stdout has: $2"; return; } ;;
      --err) [[ $err == *"$2"* ]] || { fail "$name" "stderr lacks: $2"; return; } ;;
      --err-is) [[ $err == "$2" ]] || { fail "$name" "stderr is not exactly: $2"; return; } ;;
    esac
    shift 2
  done
  pass "$name"
}

# --- help and version of every binary -------------------------------------------------
for tool in dhelix-plan dhelix-profile dhelix-run dhelix-diff; do
  run "$bin_dir/$tool" --help
  expect "$tool --help" 0 --out "Usage: $tool"
  run "$bin_dir/$tool" --version
  if [[ $status -eq 0 && $out =~ ^$tool\ [0-9]+\.[0-9]+\.[0-9]+\ \(git\ [0-9a-z]+\)$ ]]; then
    pass "$tool --version"
  else
    fail "$tool --version" "expected '$tool X.Y.Z (git HASH)'"
  fi
done

# --- dhelix-run's command line (training itself: tests/e2e/run_test.sh, under mpirun)
run "$bin_dir/dhelix-run" plan.json
expect "dhelix-run wants --plan and --data" 2 --err "--plan is required"

# --- --validate-only on the examples ---------------------------------------------------
check_example() {
  local job=$1 world=$2
  run "$plan" --validate-only "$examples/jobs/$job.json"
  expect "validate $job" 0 --out "job        $job (" --out "world size $world"
}
check_example llama-8b-a40-dp16-tp4 "64 GPUs on 8 nodes of 8 A40"
check_example llama-39b-a40-dp2-tp8-cp2-pp2-seq16k "64 GPUs on 8 nodes"
check_example llama-66b-a800-dp1-tp8-cp4-pp2-seq32k "64 GPUs on 8 nodes"
check_example phi-31b-a40-dp16-ep8-pp4 "64 GPUs on 8 nodes"
check_example llama-25b-h100-dp2-tp16 "32 GPUs on 4 nodes"
check_example llama-3-8b-hf-h100 "32 GPUs on 4 nodes"

run "$plan" --validate-only "$examples/jobs/phi-31b-a40-dp16-ep8-pp4.json"
expect "MoE summary shows EP groups" 0 --out "16 experts top-2" \
  --out "           ep      8       8  local       0 1 2 3 4 5 6 7"

# Every example validates.
all_ok=1
for job in "$examples"/jobs/*.json; do
  run "$plan" --validate-only "$job"
  [[ $status -eq 0 ]] || { all_ok=0; fail "validate $(basename "$job")" "exit $status"; }
done
[[ $all_ok -eq 1 ]] && pass "every examples/jobs file validates"

# JSON summary with a meta block; DHELIX_DETERMINISTIC=1 leaves out host and date.
run env DHELIX_DETERMINISTIC=1 "$plan" --validate-only --json \
  "$examples/jobs/llama-8b-a40-dp16-tp4.json"
expect "--json summary" 0 --out '"world_size": 64' --out '"tool": "dhelix-plan"' \
  --out '"sha256": "' --out '"tokens_per_iteration": 8388608' --no-out '"date_utc"' \
  --no-out '"host":'
first=$out
run env DHELIX_DETERMINISTIC=1 "$plan" --validate-only --json \
  "$examples/jobs/llama-8b-a40-dp16-tp4.json"
[[ $out == "$first" ]] && pass "deterministic --json is byte-identical" ||
  fail "deterministic --json is byte-identical" "two runs differ"
run env -u DHELIX_DETERMINISTIC "$plan" --validate-only --json \
  "$examples/jobs/llama-8b-a40-dp16-tp4.json"
expect "--json records the date otherwise" 0 --out '"date_utc": "'

# --- the flag form, with Megatron-LM's names -------------------------------------------
run "$plan" --validate-only --model "$examples/models/llama-8b.json" --cluster a40 \
  --data-parallel-size 16 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 1 \
  --context-parallel-size 1 --sequence-parallel --micro-batch-size 1 \
  --global-batch-size 1024 --seq-length 8192
expect "flag form with Megatron aliases" 0 --out "job        llama-8b-a40 (<flags>)" \
  --out "dp 16 · tp 4 · cp 1 · pp 1 · ep 1, sp on" --out "world size 64 GPUs"

run "$plan" --validate-only --model "$examples/models/phi-31b.json" --cluster a40 \
  --dp 16 --pp 4 --expert-model-parallel-size 8 --gbs 1600 --seq 3072
expect "flag form for an MoE job" 0 --out "dp 16 · tp 1 · cp 1 · pp 4 · ep 8, sp off"

run "$plan" --validate-only --cluster a40 --gbs 8
expect "flag form without a model" 2 \
  --err-is "dhelix-plan: error: <flags>: no job file given, so --model, --cluster, --gbs and --seq are required (missing: --model, --seq)"

# --- flags override a job file ---------------------------------------------------------
run "$plan" --validate-only --dp 8 --tp 8 --no-sp --rank-order pp-dp-ep-cp-tp \
  "$examples/jobs/llama-8b-a40-dp16-tp4.json"
expect "flags override the job file" 0 \
  --out "dp 8 · tp 8 · cp 1 · pp 1 · ep 1, sp off, rank order pp-dp-ep-cp-tp"
run "$plan" --validate-only --cluster h100 "$examples/jobs/llama-8b-a40-dp16-tp4.json"
expect "--cluster overrides the job's cluster" 0 --out "cluster    h100:"

# --- bad inputs ------------------------------------------------------------------------
run "$plan" --validate-only "$scratch/missing.json"
expect "missing job file" 3 \
  --err-is "dhelix-plan: error: $scratch/missing.json: cannot open file for reading"

printf '{\n  "schema_version": "1.0.0",\n  "name": x\n}\n' >"$scratch/bad.json"
run "$plan" --validate-only "$scratch/bad.json"
expect "bad JSON names line and column" 2 --err "dhelix-plan: error: $scratch/bad.json:3:11: not valid JSON"

# A job whose tp does not divide the heads, read as "job.json" from its own folder.
mkdir -p "$scratch/tp3"
cat >"$scratch/tp3/job.json" <<JOB
{
  "schema_version": "1.0.0",
  "name": "tp3",
  "model": "$examples/models/llama-8b.json",
  "cluster": "a40",
  "parallel": {"dp": 2, "tp": 3, "global_batch_size": 64, "seq_length": 8192}
}
JOB
run bash -c "cd '$scratch/tp3' && '$plan' --validate-only job.json"
expect "tp that does not divide the heads" 2 \
  --err-is "dhelix-plan: error: job.json: /parallel/tp: 3 does not divide num_attention_heads = 32
dhelix-plan: error: job.json: /parallel/tp: 3 does not divide num_kv_heads = 8"

run "$plan" --validate-only --tp 3 --pp 32 --gbs 1000 "$examples/jobs/llama-8b-a40-dp16-tp4.json"
expect "every problem is reported, naming flags" 2 \
  --err "dhelix-plan: error: <flags>: --tp: 3 does not divide num_attention_heads = 32" \
  --err "dhelix-plan: error: <flags>: --gbs: 1000 is not divisible by micro_batch_size·dp = 1·16 = 16 (nearest valid: 992 or 1008)" \
  --err "dhelix-plan: error: <flags>: --pp: 32 does not split num_layers = 32"

# Megatron-FSDP's flags over the tiny FSDP example: refusals name the flag that set them.
run "$plan" --validate-only --dp 1 --gbs 4 "$examples/jobs/tiny-fsdp-dp4.json"
expect "FSDP over one dp rank is refused" 2 \
  --err "dhelix-plan: error: <flags>: --dp: 1 use_megatron_fsdp shards over the data-parallel ranks: dp = 1 has nothing to shard (set dp > 1, or leave use_megatron_fsdp out)"
run "$plan" --validate-only --data-parallel-sharding-strategy optim --no-fsdp-reshard-after-forward \
  "$examples/jobs/tiny-fsdp-dp4.json"
expect "reshard_after_forward needs optim_grads_params" 2 \
  --err "dhelix-plan: error: <flags>: --no-fsdp-reshard-after-forward: false applies only with data_parallel_sharding_strategy optim_grads_params (it is optim): only then are the parameters gathered"
run "$plan" --validate-only --data-parallel-sharding-strategy zero3 "$examples/jobs/tiny-fsdp-dp4.json"
expect "an unknown strategy is refused by the flag" 2 --err "--data-parallel-sharding-strategy"

sed 's/"parallel"/"paralel"/' "$scratch/tp3/job.json" >"$scratch/tp3/typo.json"
run bash -c "cd '$scratch/tp3' && '$plan' --validate-only typo.json"
expect "unknown key with did-you-mean" 2 \
  --err 'dhelix-plan: error: typo.json: /paralel: unknown key (did you mean "parallel"?)' \
  --err "dhelix-plan: error: typo.json: /parallel: is required but missing"

sed 's/"cluster": "a40"/"cluster": "h10"/' "$scratch/tp3/job.json" >"$scratch/tp3/preset.json"
run bash -c "cd '$scratch/tp3' && '$plan' --validate-only preset.json"
expect "unknown preset with did-you-mean" 2 --err '"h10" is neither a cluster preset (a40, a800, h100, h200) nor a cluster file (did you mean "h100"?)'

sed 's/"schema_version": "1.0.0"/"schema_version": "2.0.0"/' "$scratch/tp3/job.json" >"$scratch/tp3/v2.json"
run bash -c "cd '$scratch/tp3' && '$plan' --validate-only v2.json"
expect "another schema major version" 5 \
  --err-is 'dhelix-plan: error: v2.json: /schema_version: "2.0.0" has major version 2, this dhelix reads major version 1 only'

run "$plan" --validate-only --tp abc "$examples/jobs/llama-8b-a40-dp16-tp4.json"
expect "a flag that does not parse" 2 --err "Run with --help for more information."

# Size flags repeat what was typed; CLI11 alone clamped this to INT64_MAX.
run "$plan" --validate-only --tp 99999999999999999999 "$examples/jobs/llama-8b-a40-dp16-tp4.json"
expect "a size flag beyond int64" 2 --err "dhelix-plan: error: --tp: 99999999999999999999 is too large"
run "$plan" --validate-only --tensor-model-parallel-size 2x "$examples/jobs/llama-8b-a40-dp16-tp4.json"
expect "a Megatron alias with a bad value" 2 --err 'dhelix-plan: error: --tp: "2x" is not an integer'
run "$plan" --validate-only --tensor-model-parallel-size 2 "$examples/jobs/llama-8b-a40-dp16-tp4.json"
expect "a Megatron alias still sets tp" 0 --out "dp 16 · tp 2"

# A job file completed by flags: it names neither model nor cluster.
cat >"$scratch/partial.json" <<JOB
{
  "schema_version": "1.0.0",
  "name": "partial",
  "parallel": {"dp": 2, "tp": 4, "global_batch_size": 64, "seq_length": 8192}
}
JOB
run "$plan" --validate-only --model "$examples/models/llama-8b.json" --cluster a40 "$scratch/partial.json"
expect "model and cluster from flags complete a job file" 0 --out "dp 2 · tp 4"
run "$plan" --validate-only --cluster a40 "$scratch/partial.json"
expect "a job file without a model and no --model" 2 \
  --err-is "dhelix-plan: error: $scratch/partial.json: /model: is required but missing (give it in the file or with --model)"

run "$plan" "$examples/jobs/llama-8b-a40-dp16-tp4.json"
expect "planning prints the report (tests/e2e/plan_test.sh covers the rest)" 0 --out "megatron-1f1b"

# Megatron's virtual pipeline flags for the interleaved baseline (docs/pipeline.md).
job70=$examples/jobs/llama-3-70b-h100-dp2-tp4-cp2-pp4.json
run "$plan" "$job70" --num-layers-per-virtual-pipeline-stage 2
expect "--num-layers-per-virtual-pipeline-stage sets v" 0 \
  --out "megatron-interleaved: virtual pipeline size 10; best baseline that fits:"
run "$plan" "$job70" --virtual-pipeline-model-parallel-size 3
expect "a virtual pipeline size that does not divide the stage's layers" 2 \
  --err "--virtual-pipeline-model-parallel-size 3: Megatron refuses it for num_layers = 80 on pp = 4: Megatron needs every stage's layers divisible by the virtual pipeline size 3; stage 0 holds 20"
run "$plan" "$job70" --num-layers-per-virtual-pipeline-stage 3
expect "layers per virtual stage that do not divide the stage's layers" 2 \
  --err "--num-layers-per-virtual-pipeline-stage 3: it must divide the layers per stage"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
