#!/usr/bin/env bash
# dhelix-run with uneven pipeline stages (docs/pipeline.md, "Uneven stages" and "Unequal
# chunks") under mpirun. The model is llama-tiny with 8 layers (written here; the shipped
# tiny model has 4, too few for a middle stage); the job is examples/jobs/tiny-tp2-pp2.json
# on one TP rank:
#   1. pp 3 with Megatron's --decoder-first/last-pipeline-num-layers 4 and 2: the folded
#      stage 0 holds chunks of 3 and 1 layers, so its SI blocks pair one layer and run two
#      alone; the plan checks, and --verify finds the co-executed and sequential schedules
#      bitwise equal under random delays;
#   2. its 3 steps' losses equal, bit for bit, those of the same model on one stage and on
#      pp 2 (even), and a resume continues it bit for bit;
#   3. 7 layers on pp 3 (no F = La split: the planner's own unequal fallback) plans, checks
#      and verifies;
#   4. --backend cuda refuses uneven stages by name before any rank starts.
# Usage: run_uneven_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=${1:?usage: run_uneven_test.sh BIN_DIR SOURCE_DIR}
src=${2:?usage: run_uneven_test.sh BIN_DIR SOURCE_DIR}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
run() { # run RANKS ARGS...: dhelix-run under mpirun, output in $work/out
  local ranks=$1
  shift
  mpirun --oversubscribe -np "$ranks" "$bin/dhelix-run" --data "$src/examples/data/corpus.txt" \
    --no-progress "$@" >"$work/out" 2>&1
}
# plan NAME LAYERS ARGS...: the tiny job on one TP rank with LAYERS layers, planned and
# checked into $work/NAME.json.
plan() {
  local name=$1 layers=$2
  shift 2
  python3 - "$src" "$work" "$layers" <<'PY'
import json, os, sys
src, work, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = json.load(open(os.path.join(src, "examples/models/llama-tiny.json")))
model["num_layers"] = layers
json.dump(model, open(os.path.join(work, f"llama-tiny-{layers}l.json"), "w"))
PY
  "$bin/dhelix-plan" "$src/examples/jobs/tiny-tp2-pp2.json" --model "$work/llama-tiny-$layers"l.json \
    --tp 1 --no-sp --gbs 12 "$@" -o "$work/$name.json" >"$work/$name.plan.log" 2>&1 || {
    fail "planning $name"
    cat "$work/$name.plan.log"
    return
  }
  "$bin/dhelix-plan" --check "$work/$name.json" >"$work/$name.check.log" 2>&1 || {
    fail "$name does not check"
    cat "$work/$name.check.log"
  }
}
# verify NAME RANKS: --verify reports 2 bitwise-equal steps.
verify() {
  if ! run "$2" --plan "$work/$1.json" --steps 2 --verify --jitter-us 200; then
    fail "$1 --verify"
    cat "$work/out"
  elif [[ $(grep -c "bitwise equal on $2 ranks" "$work/out") != 2 ]]; then
    fail "$1 --verify did not report two verified steps"
    cat "$work/out"
  fi
}

# 1. Unequal chunks on stage 0 of the W (--shape w: auto may take interleaved stages, whose
#    chunks are not the fold's down and up legs).
plan uneven 8 --pp 3 --decoder-first-pipeline-num-layers 4 --decoder-last-pipeline-num-layers 2 --shape w
python3 - "$work/uneven.json" <<'PY' || fail "uneven: stage 0's chunks are not 3 and 1 layers"
import json, sys
stage = json.load(open(sys.argv[1]))["stages"][0]
assert (stage["down_layers"]["count"], stage["up_layers"]["count"]) == (3, 1), stage
PY
verify uneven 3

# 2. The same losses as even stages, and an exact resume.
plan one-stage 8 --pp 1
plan even 8 --pp 2
for name in uneven one-stage even; do
  ranks=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['stages']))" \
    "$work/$name.json")
  run "$ranks" --plan "$work/$name.json" --steps 3 --loss-log "$work/$name.log" || {
    fail "3 steps of $name"
    cat "$work/out"
  }
done
cmp -s "$work/uneven.log" "$work/one-stage.log" || fail "uneven stages' losses differ from one stage's"
cmp -s "$work/uneven.log" "$work/even.log" || fail "uneven stages' losses differ from pp 2's"
if ! run 3 --plan "$work/uneven.json" --steps 2 --checkpoint-dir "$work/ckpt" \
  --loss-log "$work/a.log"; then
  fail "uneven: 2 steps with a checkpoint"
  cat "$work/out"
elif ! run 3 --plan "$work/uneven.json" --steps 3 --checkpoint-dir "$work/ckpt" --resume \
  --loss-log "$work/b.log"; then
  fail "uneven: resume to step 3"
  cat "$work/out"
fi
cat "$work/a.log" "$work/b.log" 2>/dev/null | cmp -s - "$work/uneven.log" ||
  fail "uneven: 2 steps + a resumed third differ from 3 steps in one run"

# 3. The planner's own split where no F = La exists (7 layers on pp 3).
plan fallback 7 --pp 3 --shape w
grep -q "warning" "$work/fallback.plan.log" || fail "fallback: the plan does not warn of its split"
verify fallback 3

# 4. Not on CUDA yet.
if run 3 --plan "$work/uneven.json" --steps 1 --backend cuda; then
  fail "--backend cuda ran uneven stages"
elif ! grep -q "does not run uneven pipeline stages .* on the cuda backend (cpu only)" "$work/out"; then
  fail "--backend cuda: no refusal naming uneven stages"
  cat "$work/out"
fi

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "dhelix-run with uneven stages: all passed"
