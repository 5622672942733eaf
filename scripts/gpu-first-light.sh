#!/usr/bin/env bash
# gpu-first-light.sh: the measurements that calibrate dhelix's h100 preset from components
# and time its own runtime, on ONE H100 or H200. Run it after scripts/gpu-check.sh on the
# same warm machine (the build is then incremental): about 7 minutes, one deadline for all,
# each result written to OUT_DIR the moment it is known, so a run cut short keeps what it
# measured.
#
#   scripts/gpu-first-light.sh [OUT_DIR]     (default ./gpu-first-light-out)
#   env: BUDGET_S (420), JOBS, DHELIX_BUILD_DIR (./build-gpu), CUDA_HOME, DHELIX_PREBUILT=1
#
# Most valuable first (docs/gpu.md, "The GPU self-check and first light"):
#   1. operator times at real shapes: dhelix-profile --backend cuda on one GPU, set beside
#      dhelix-profile --backend model for the same job (scripts/profile-table.py: measured,
#      model, error per op): Llama-3-8B at sequence 8192, micro-batch 1;
#   2. interference: a GEMM's speed beside a copy kernel on the SM count NCCL's all-gather
#      and reduce-scatter take (16, 24, 32 CTAs), the model's 0.83-0.87 of solo speed;
#   3. Llama-3-70B's TP 8 slice (heads, KV heads, FFN and vocabulary / 8 on one GPU: the
#      GEMM and attention shapes one rank of TP 8 runs), sequence 8192;
#   4. the runtime's own speed: a 0.54B-parameter Llama (hidden 2048, head dim 128, sequence
#      4096), planned from its own CUDA profile, run co-executed and --sequential with
#      --trace; measured against predicted iteration (dhelix-diff --measured) and MFU;
#   5. attention at head dims 64 and 128, sequences 4096 and 16384 (causal, GQA);
#   6. Mixtral-8x7B's experts on one GPU (EP 1: 8 experts of capacity C instead of EP 8's
#      one expert of 8 C rows; the same FLOPs, another grouping).
# Without a GPU every step is a SKIP that says "no GPU" and the script exits 0.
set -uo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-./gpu-first-light-out}
BUDGET_S=${BUDGET_S:-420}
# shellcheck source=gpu-lib.sh
. "$SRC/scripts/gpu-lib.sh"
gpu_lib_init
mkdir -p "$OUT/jobs" "$OUT/profiles" "$OUT/tables" "$OUT/runs"
PLAN=$BUILD/tools/dhelix-plan
PROFILE=$BUILD/tools/dhelix-profile
RUN=$BUILD/tools/dhelix-run
DIFF=$BUILD/tools/dhelix-diff
INTERFERENCE=$BUILD/tests/dhelix_gpu_interference
HF=$SRC/examples/models/hf

note "dhelix gpu-first-light, $(date -Is), $(git -C "$SRC" rev-parse --short=12 HEAD 2>/dev/null || echo 'no git'), budget ${BUDGET_S} s"
GPUS=$(count_gpus)
if [ "$GPUS" -eq 0 ]; then
  # Nothing to measure; the jobs are still written and modelled with the tools already in
  # $BUILD (if any), so that a job the tools would refuse is found before device time is spent.
  note "INFO  no GPU: nothing is measured; each job is only checked against the model backend"
else
  note "INFO  GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n 1)"
  unset CUDA_MODULE_LOADING CUDA_DEVICE_MAX_CONNECTIONS NCCL_RUNTIME_CONNECT NCCL_ALGO NCCL_PROTO \
    DHELIX_ATTENTION
  ensure_built "$(budget 240 150)" dhelix-plan dhelix-profile dhelix-run dhelix-diff \
    dhelix_gpu_interference
fi

# write_job NAME MODEL PARALLEL: $OUT/jobs/NAME.json on the h100 preset; MODEL is a path or
# an inline model object, PARALLEL the "parallel" object.
write_job() {
  local model=$2
  [ "${model:0:1}" = "{" ] || model="\"$model\""
  printf '{"schema_version": "1.0.0", "name": "%s", "model": %s, "cluster": "h100", "parallel": %s}\n' \
    "$1" "$model" "$3" >"$OUT/jobs/$1.json"
}
one_gpu() { # one_gpu SEQ [GBS] [EXTRA]: a one-rank parallel object
  printf '{"dp": 1, "tp": 1, "sp": false, "pp": 1, "micro_batch_size": 1, "global_batch_size": %s, "seq_length": %s%s}' \
    "${2:-2}" "$1" "${3:-}"
}
# op_table NAME CAP RESERVE: job NAME modelled, measured on the GPU and compared; without a
# GPU only modelled (the job must be one the tools accept).
op_table() {
  local name=$1 measured=$OUT/profiles/$1-cuda.json modelled=$OUT/profiles/$1-model.json
  local secs
  if ! run_logged "model-$name" 30 "$PROFILE" --backend model "$OUT/jobs/$name.json" -o "$modelled"; then
    result FAIL "op-table-$name" "the model backend refuses the job: $(first_error "$LOGS/model-$name.log")"
    return 1
  fi
  if [ "$GPUS" -eq 0 ]; then
    result SKIP "op-table-$name" "no GPU (job checked: $(grep -c '"signature"' "$modelled") ops modelled)"
    return 1
  fi
  secs=$(budget "$2" "$3")
  if [ "$secs" -eq 0 ]; then
    result SKIP "op-table-$name" "no time left"
    return 1
  fi
  if ! run_logged "profile-$name" "$secs" "$PROFILE" --backend cuda "$OUT/jobs/$name.json" \
    --warmup 2 --samples 5 --max-samples 15 -o "$measured"; then
    result FAIL "op-table-$name" "$(why $?): $(first_error "$LOGS/profile-$name.log")"
    return 1
  fi
  if "$SRC/scripts/profile-table.py" "$measured" "$modelled" >"$OUT/tables/$name.md" 2>&1; then
    result PASS "op-table-$name" "$(tail -n 1 "$OUT/tables/$name.md") (${LAST_WALL} s); $OUT/tables/$name.md"
  else
    result WARN "op-table-$name" "profiled, no table: $(tail -n 1 "$OUT/tables/$name.md")"
  fi
}

# 1. Llama-3-8B at sequence 8192 on one GPU
write_job llama3-8b "$HF/llama-3-8b.config.json" "$(one_gpu 8192)"
op_table llama3-8b 90 250

# 2. Interference: GEMM beside a copy on NCCL's CTA counts
secs=$(budget 45 200)
if [ "$GPUS" -eq 0 ]; then
  result SKIP interference "no GPU"
elif [ "$secs" -gt 0 ] && run_logged interference "$secs" "$INTERFERENCE" --ctas 16,24,32; then
  grep '^{' "$LOGS/interference.log" >"$OUT/interference.jsonl"
  fractions=$(sed -n 's/.*"copy_ctas": \([0-9]*\),.*"gemm_speed_fraction": \([0-9.]*\), "sm_share_left": \([0-9.]*\), "membound_speed_fraction": \([0-9.]*\).*/\1 CTAs: GEMM at \2 of solo (SMs left \3), copy-bound kernel at \4/p' \
    "$OUT/interference.jsonl" | paste -sd';')
  result PASS interference "${fractions:-no figures} (model: 0.83-0.87)"
else
  result FAIL interference "$(why $?): $(first_error "$LOGS/interference.log")"
fi

# 3. Llama-3-70B's TP 8 slice: what one rank of TP 8 computes, on one GPU
slice='{"schema_version": "1.0.0", "name": "llama-3-70b-tp8-slice", "norm": "rmsnorm",
  "activation": "swiglu", "position": "rope", "hidden_size": 8192, "ffn_hidden_size": 3584,
  "num_layers": 2, "num_attention_heads": 8, "num_kv_heads": 1, "head_dim": 128,
  "vocab_size": 16032, "max_seq_length": 8192, "tied_embeddings": false,
  "linear_bias": false, "dtype": "bf16"}'
write_job llama3-70b-tp8-slice "$slice" "$(one_gpu 8192)"
op_table llama3-70b-tp8-slice 90 170

# 4. The runtime's speed: a 0.54B Llama, planned from its own profile, both schedules
mid='{"schema_version": "1.0.0", "name": "llama-mid", "norm": "rmsnorm", "activation": "swiglu",
  "position": "rope", "hidden_size": 2048, "ffn_hidden_size": 5632, "num_layers": 12,
  "num_attention_heads": 16, "num_kv_heads": 4, "head_dim": 128, "vocab_size": 256,
  "max_seq_length": 4096, "tied_embeddings": false, "linear_bias": false, "dtype": "bf16"}'
write_job llama-mid "$mid" "$(one_gpu 4096 4)"
runtime_run() { # runtime_run TAG ARGS...: 6 steps with a trace; tokens/s in the summary
  local tag=$1
  shift
  if run_logged "run-$tag" "$(budget 75 "${RESERVE:-60}")" "$RUN" --backend cuda \
    --plan "$OUT/runs/llama-mid.plan.json" --data "$SRC/examples/data/corpus.txt" --steps 6 \
    --trace "$OUT/runs/llama-mid-$tag.trace.json" "$@"; then
    result PASS "run-$tag" "$(grep -h '^dhelix-run: done:' "$LOGS/run-$tag.log" | sed 's/^dhelix-run: done: //' | cut -c1-120)"
    return 0
  fi
  result FAIL "run-$tag" "$(why $?): $(first_error "$LOGS/run-$tag.log")"
  return 1
}
if [ "$GPUS" -eq 0 ]; then
  # The plan the run would use, made from the model's profile instead of a measured one.
  if run_logged plan-llama-mid 60 "$PLAN" "$OUT/jobs/llama-mid.json" -o "$OUT/runs/llama-mid.plan.json"; then
    result SKIP runtime-mfu "no GPU (the job plans: $(grep -m 1 -E '^dhelix ' "$LOGS/plan-llama-mid.log" | tr -s ' ' | cut -c1-80))"
  else
    result FAIL runtime-mfu "the job does not plan: $(first_error "$LOGS/plan-llama-mid.log")"
  fi
elif op_table llama-mid 60 140 &&
  run_logged plan-llama-mid 60 "$PLAN" "$OUT/jobs/llama-mid.json" --profile \
    "$OUT/profiles/llama-mid-cuda.json" -o "$OUT/runs/llama-mid.plan.json"; then
  grep -E '^(scheme|dhelix|megatron-1f1b) ' "$LOGS/plan-llama-mid.log" | sed 's/^/      /' | tee -a "$SUMMARY"
  RESERVE=100 runtime_run coexec
  RESERVE=60 runtime_run sequential --sequential
  for tag in coexec sequential; do
    trace=$OUT/runs/llama-mid-$tag.trace.json
    [ -s "$trace" ] || continue
    run_logged "diff-$tag" 30 "$DIFF" "$OUT/runs/llama-mid.plan.json" --measured "$trace"
    result INFO "measured-vs-plan-$tag" "$(grep -m 1 -iE 'iteration' "$LOGS/diff-$tag.log" | cut -c1-200)"
  done
else
  result FAIL runtime-mfu "no plan: $(first_error "$LOGS/plan-llama-mid.log")"
fi

# 5. Attention at head dims 64 and 128, sequences 4096 and 16384 (a two-layer probe model:
#    the fold needs an even layer count)
for seq in 4096 16384; do
  for head_dim in 128 64; do
    heads=$((2048 / head_dim))
    probe="{\"schema_version\": \"1.0.0\", \"name\": \"attention-probe\", \"norm\": \"rmsnorm\",
      \"activation\": \"swiglu\", \"position\": \"rope\", \"hidden_size\": 2048,
      \"ffn_hidden_size\": 2048, \"num_layers\": 2, \"num_attention_heads\": $heads,
      \"num_kv_heads\": $((heads / 4)), \"head_dim\": $head_dim, \"vocab_size\": 256,
      \"max_seq_length\": 16384, \"tied_embeddings\": false, \"linear_bias\": false, \"dtype\": \"bf16\"}"
    write_job "attention-d$head_dim-s$seq" "$probe" "$(one_gpu "$seq")"
    op_table "attention-d$head_dim-s$seq" 45 40
    grep -E '`attention\.' "$OUT/tables/attention-d$head_dim-s$seq.md" 2>/dev/null | sed 's/^/      /' | tee -a "$SUMMARY"
  done
done

# 6. Mixtral-8x7B's experts on one GPU (EP 1, sequence 4096)
write_job mixtral-experts "$HF/mixtral-8x7b-v0.1.config.json" "$(one_gpu 4096 2 ', "ep": 1')"
op_table mixtral-experts 60 5

note "----  $FAILS FAIL; $(($(date +%s) - T0)) s; tables in $OUT/tables, summary $SUMMARY"
[ "$FAILS" -eq 0 ]
