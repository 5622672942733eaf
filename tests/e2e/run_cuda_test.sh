#!/usr/bin/env bash
# dhelix-run --backend cuda end to end.
#   * Without a GPU (this project's machines and CI): a clear error on every rank, exit
#     status 4 (unsupported), no checkpoint written; the same for a MoE plan with expert TP.
#   * With 2 or more GPUs (a real cluster node): --verify on tiny-tp2 and on
#     tiny-tp2-recompute (full activation recompute; 2 ranks each): the
#     co-executed schedule on the CUDA streams and the sequential one give bitwise-equal
#     losses and gradients, with NCCL's algorithm and protocol pinned (docs/gpu.md) and
#     random delays before every op (--jitter-us, so timing cannot hide a missing wait); the
#     loss falls over 30 steps; 6 steps == 3 steps + a resume of 3, bit for bit. With 4 or
#     more GPUs also --verify on tiny-tp2-pp2 and tiny-dp2-tp2 (NCCL pipeline channels and
#     the DP gradient sum) and on tiny-cp2-tp2 (context parallelism: the ring's steps on
#     NCCL, the ring attention kernels, the DP x CP gradient sum), whose 10-step losses
#     then stay within 2 % of tiny-tp2's on the same data (the same model and sequences;
#     bf16 and another fold order of the attention, docs/kernels.md). MoE: --verify on
#     tiny-moe-ep2 and tiny-moe-ep2-recompute (2 GPUs), tiny-moe-ep2-tp2 (expert TP) and
#     tiny-moe-ep2-pp2 (4 GPUs); tiny-dp2-tp2 with the overlapped reduction, and with the
#     distributed optimizer and the overlapped gather (4 GPUs), whose losses equal the
#     after-iteration reduction's bit for bit. FSDP (examples/jobs/tiny-fsdp-dp4.json planned
#     here, DP 4, and DP 2 x TP 2 with sequence parallelism; 4 GPUs): --verify.
#   * Without a GPU also: the DP reduction's flags and an FSDP plan reach the device (none
#     refused by name).
#   * With exactly 1 GPU: skipped (exit 77): every shipped plan needs 2 ranks or more.
#   * Every run: --watchdog-s WATCHDOG_S (60) and mpirun under `timeout` (see run()).
# Usage: run_cuda_test.sh BIN_DIR SOURCE_DIR <ON|OFF: built with CUDA>
set -uo pipefail
bin=${1:?usage: run_cuda_test.sh BIN_DIR SOURCE_DIR ON|OFF}
src=${2:?usage: run_cuda_test.sh BIN_DIR SOURCE_DIR ON|OFF}
with_cuda=${3:?usage: run_cuda_test.sh BIN_DIR SOURCE_DIR ON|OFF}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
corpus=$src/examples/data/corpus.txt
plans=$src/examples/plans
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# Hangs: dhelix's watchdog gives up on any wait for the GPU after WATCHDOG_S and names the
# busy streams and communicators (docs/gpu.md); mpirun runs under `timeout` with RUN_LIMIT_S,
# the watchdog's time plus a margin for start-up (MPI, CUDA, NCCL) and the steps, so that a
# hang the watchdog misses still ends this run (exit 124, said so) instead of ctest killing
# the whole script without a word; ctest's own TIMEOUT stays above both.
WATCHDOG_S=${WATCHDOG_S:-60}
RUN_LIMIT_S=${RUN_LIMIT_S:-$((WATCHDOG_S + 120))}
run() { # run RANKS ARGS...: dhelix-run --backend cuda under mpirun, output in $work/out
  local ranks=$1 status=0
  shift
  timeout --kill-after=10 "$RUN_LIMIT_S" mpirun --oversubscribe -np "$ranks" "$bin/dhelix-run" \
    --backend cuda --watchdog-s "$WATCHDOG_S" --data "$corpus" "$@" >"$work/out" 2>&1 || status=$?
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "HANG: mpirun -np $ranks dhelix-run $* ran past ${RUN_LIMIT_S} s and was killed" \
      "(the watchdog, --watchdog-s $WATCHDOG_S, did not end it); its output:" >>"$work/out"
  fi
  return "$status"
}
loss_bits() { # loss_bits LOG STEP: the loss bits of that step in a --loss-log file
  grep "\"step\": $2," "$1" | sed 's/.*"loss_bits": "\([^"]*\)".*/\1/'
}

# FSDP's plans (optim_grads_params), planned from the example job: DP 4, and DP 2 x TP 2
# with sequence parallelism.
fsdp_job=$src/examples/jobs/tiny-fsdp-dp4.json
"$bin/dhelix-plan" "$fsdp_job" -o "$work/tiny-fsdp-dp4.json" >/dev/null ||
  fail "planning tiny-fsdp-dp4"
"$bin/dhelix-plan" "$fsdp_job" --dp 2 --tp 2 --sequence-parallel -o "$work/tiny-fsdp-sp.json" \
  >/dev/null || fail "planning tiny-fsdp-dp4 with DP 2 x TP 2 and SP"

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi

if [ "$gpus" -eq 0 ]; then
  case "$with_cuda" in
    ON | on | TRUE | true | 1) expected="--backend cuda: no CUDA device found (cudaGetDeviceCount: " ;;
    *) expected="--backend cuda: this dhelix-run was built without CUDA" ;;
  esac
  run 2 --plan "$plans/tiny-tp2.json" --steps 1 --checkpoint-dir "$work/ckpt"
  status=$?
  if [ "$status" -ne 4 ]; then
    fail "no GPU: exit $status, expected 4"
    cat "$work/out"
  elif [ "$(grep -cF -- "$expected" "$work/out")" -lt 1 ]; then
    fail "no GPU: message lacks '$expected'"
    cat "$work/out"
  elif [ -e "$work/ckpt" ]; then
    fail "no GPU: a checkpoint directory was created"
  else
    echo "ok    no GPU: $(grep -F -- "$expected" "$work/out" | head -n 1)"
  fi
  # The data-parallel reduction's flags are the CPU's on CUDA too (not refused by name):
  # the same error.
  run 4 --plan "$plans/tiny-dp2-tp2.json" --steps 1 --overlap-grad-reduce \
    --distributed-optimizer --overlap-param-gather --ddp-bucket-size 1000
  status=$?
  if [ "$status" -ne 4 ] || [ "$(grep -cF -- "$expected" "$work/out")" -lt 1 ]; then
    fail "no GPU, DP flags: exit $status, expected 4 and '$expected'"
    cat "$work/out"
  else
    echo "ok    no GPU, --overlap-grad-reduce --distributed-optimizer --overlap-param-gather: the same error"
  fi
  # Every MoE plan reaches the device (no MoE setting is refused on CUDA): the same error.
  run 4 --plan "$plans/tiny-moe-ep2-tp2.json" --steps 1 --checkpoint-dir "$work/ckpt"
  status=$?
  if [ "$status" -ne 4 ] || [ "$(grep -cF -- "$expected" "$work/out")" -lt 1 ]; then
    fail "no GPU, tiny-moe-ep2-tp2: exit $status, expected 4 and '$expected'"
    cat "$work/out"
  else
    echo "ok    no GPU, tiny-moe-ep2-tp2: the same error"
  fi
  # FSDP reaches the device too (the engine runs its gathers and reduce-scatters).
  run 4 --plan "$work/tiny-fsdp-dp4.json" --steps 1
  status=$?
  if [ "$status" -ne 4 ] || [ "$(grep -cF -- "$expected" "$work/out")" -lt 1 ]; then
    fail "no GPU, tiny-fsdp-dp4: exit $status, expected 4 and '$expected'"
    cat "$work/out"
  else
    echo "ok    no GPU, tiny-fsdp-dp4: the same error"
  fi
  echo "$failures failed"
  [ "$failures" -eq 0 ]
  exit
fi
if [ "$gpus" -lt 2 ]; then
  echo "skipped: 1 GPU visible; the shipped plans need 2 ranks, one GPU each"
  exit 77
fi

# Bitwise --verify needs NCCL to reduce the same way in both schedules.
export NCCL_ALGO=Ring NCCL_PROTO=Simple
cases=("tiny-tp2 2" "tiny-tp2-recompute 2" "tiny-moe-ep2 2" "tiny-moe-ep2-recompute 2")
# The last case sums DP gradients in many small buckets (--ddp-bucket-size).
if [ "$gpus" -ge 4 ]; then
  cases+=("tiny-tp2-pp2 4" "tiny-dp2-tp2 4" "tiny-dp2-tp2 4 --ddp-bucket-size 1000"
    "tiny-cp2-tp2 4" "tiny-moe-ep2-tp2 4" "tiny-moe-ep2-pp2 4"
    "tiny-dp2-tp2 4 --overlap-grad-reduce --ddp-bucket-size 1000"
    "tiny-dp2-tp2 4 --overlap-grad-reduce --distributed-optimizer --overlap-param-gather --ddp-bucket-size 1000")
fi
# FSDP, by path: plans planned above.
if [ "$gpus" -ge 4 ]; then
  for plan in "$work/tiny-fsdp-dp4.json" "$work/tiny-fsdp-sp.json"; do
    if run 4 --plan "$plan" --steps 3 --verify --jitter-us 200 &&
      grep -q "^verify step 3: co-executed and sequential schedules bitwise equal" "$work/out"; then
      echo "ok    $(basename "$plan"): --verify on 4 GPUs"
    else
      fail "$(basename "$plan"): --verify on 4 GPUs"
      cat "$work/out"
    fi
  done
fi
for case in "${cases[@]}"; do
  read -r plan ranks extra <<<"$case"
  # shellcheck disable=SC2086 # extra holds zero or more flags
  if run "$ranks" --plan "$plans/$plan.json" --steps 3 --verify --jitter-us 200 $extra &&
    grep -q "^verify step 3: co-executed and sequential schedules bitwise equal" "$work/out"; then
    echo "ok    $plan $extra: --verify on $ranks GPUs"
  else
    fail "$plan $extra: --verify on $ranks GPUs"
    cat "$work/out"
  fi
done

# The overlapped reduction sums what the after-iteration one sums, bit for bit
# (device_gradient_reducer.h): the same losses over 4 steps.
if [ "$gpus" -ge 4 ]; then
  for mode in overlap no-overlap; do
    run 4 --plan "$plans/tiny-dp2-tp2.json" --steps 4 --ddp-bucket-size 1000 \
      "--$mode-grad-reduce" --loss-log "$work/$mode.jsonl" || cat "$work/out"
  done
  if [ -s "$work/overlap.jsonl" ] && [ "$(loss_bits "$work/overlap.jsonl" 4)" = "$(loss_bits "$work/no-overlap.jsonl" 4)" ]; then
    echo "ok    tiny-dp2-tp2: overlapped and after-iteration reduction bitwise equal"
  else
    fail "tiny-dp2-tp2: overlapped and after-iteration losses differ"
  fi
fi

# The CPU test's criterion (run_test.sh): the loss of step 30 below 3/4 of step 1's.
if run 2 --plan "$plans/tiny-tp2.json" --steps 30 --loss-log "$work/loss.jsonl"; then
  first=$(head -n 1 "$work/loss.jsonl" | sed 's/.*"loss": \([^,]*\),.*/\1/')
  last=$(tail -n 1 "$work/loss.jsonl" | sed 's/.*"loss": \([^,]*\),.*/\1/')
  if awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.75 * a) }'; then
    echo "ok    loss falls: $first -> $last in 30 steps"
  else
    fail "loss did not fall below 3/4: $first -> $last"
  fi
else
  fail "training 30 steps"
  cat "$work/out"
fi

# Context parallelism against CP 1 (tiny-tp2: the same model, data and tp).
if [ "$gpus" -ge 4 ]; then
  if run 2 --plan "$plans/tiny-tp2.json" --steps 10 --loss-log "$work/cp1.jsonl" &&
    run 4 --plan "$plans/tiny-cp2-tp2.json" --steps 10 --loss-log "$work/cp2.jsonl" &&
    python3 - "$work/cp2.jsonl" "$work/cp1.jsonl" <<'PY'; then
import json, sys
cp2, cp1 = ([json.loads(line)["loss"] for line in open(path)] for path in sys.argv[1:3])
worst = max(abs(a - b) / b for a, b in zip(cp2, cp1))
print(f"CP 2 against CP 1: largest relative loss difference {worst:.2g}")
sys.exit(0 if len(cp2) == len(cp1) == 10 and worst <= 0.02 else 1)
PY
    echo "ok    tiny-cp2-tp2: 10 steps within 2 % of tiny-tp2's losses"
  else
    fail "tiny-cp2-tp2 against tiny-tp2: $(cat "$work/out")"
  fi
fi

run 2 --plan "$plans/tiny-tp2.json" --steps 6 --loss-log "$work/whole.jsonl" ||
  fail "6 steps: $(cat "$work/out")"
run 2 --plan "$plans/tiny-tp2.json" --steps 3 --checkpoint-dir "$work/ckpt" ||
  fail "3 steps: $(cat "$work/out")"
run 2 --plan "$plans/tiny-tp2.json" --steps 6 --checkpoint-dir "$work/ckpt" --resume \
  --loss-log "$work/resumed.jsonl" || fail "resume: $(cat "$work/out")"
whole=$(loss_bits "$work/whole.jsonl" 6)
resumed=$(loss_bits "$work/resumed.jsonl" 6)
if [ -n "$whole" ] && [ "$whole" = "$resumed" ]; then
  echo "ok    resume: step 6 loss bits $whole in both runs"
else
  fail "resume: step 6 loss bits '$whole' vs '$resumed'"
fi

echo "$failures failed"
[ "$failures" -eq 0 ]
