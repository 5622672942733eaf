#!/usr/bin/env bash
# The data-parallel gradient reduction of the CPU backend (runtime/train/gradient_reduction.h)
# under mpirun:
#   1. bits: on DP 2 x TP 2, MoE EP 2 (expert-data-parallel buckets) and CP 2 x TP 2, three
#      steps give bitwise-equal losses and checkpoints (weights and AdamW moments) whether
#      the buckets are summed while the backward runs (--overlap-grad-reduce, small buckets
#      of 4096 elements), after the iteration (--no-overlap-grad-reduce), one parameter per
#      bucket after the iteration (--ddp-bucket-size 1), or in the planner's bucket (the
#      default, one bucket on these tiny models); with the plans' distributed optimizer
#      (reduce-scatter, AdamW on the shard, all-gather; sharded_adamw.h) and without it
#      (--no-distributed-optimizer: all-reduce and AdamW everywhere; per parameter after the
#      iteration, as dhelix-run summed before the buckets, and overlapped); with the weights
#      all-gathered under the next forward (the plans' overlap_param_gather) and in the
#      optimizer step (--no-overlap-param-gather);
#   1b. resume: 5 steps straight equal 3 steps + a resume of 2 more, also when the
#      checkpoint was written with the distributed optimizer and resumed without it, and
#      the other way round (one checkpoint format);
#   2. --verify passes bitwise under --jitter-us with small overlapped buckets;
#   3. the trace (--trace) has one dp_bucket slice per bucket and step on the "dp buckets"
#      thread, buckets numbered 0..n-1; overlapped, on every rank some step's first bucket
#      starts before the iteration's last backward instruction ends; after the iteration,
#      every bucket starts after the iteration's end; overlapped, the previous step's
#      weights are gathered in one dp_param_gather slice per bucket, and on every rank some
#      step's execution starts before its last gather ends (the step does not wait for them);
#   4. bad input: --ddp-bucket-size 0.
# Usage: dp_overlap_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=${1:?usage: dp_overlap_test.sh BIN_DIR SOURCE_DIR}
src=${2:?usage: dp_overlap_test.sh BIN_DIR SOURCE_DIR}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
corpus=$src/examples/data/corpus.txt
plans=$src/examples/plans
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
run() { # run RANKS ARGS...: dhelix-run under mpirun, output in $work/out
  local ranks=$1
  shift
  mpirun --oversubscribe -np "$ranks" "$bin/dhelix-run" --data "$corpus" --no-progress "$@" \
    >"$work/out" 2>&1
}

# The tensors (name -> float32 bytes) of every shard of a checkpoint step directory, as
# one digest per rank: the shard's header holds the run id, which differs run to run.
cat >"$work/tensors.py" <<'PY'
import hashlib, struct, sys, pathlib
def tensors(path):
    data = pathlib.Path(path).read_bytes()
    at = 8 + 4 + 4 + 8 * 4 + 8 * 6 + 64 + 32  # magic .. identity
    (count,) = struct.unpack_from("<q", data, at)
    at += 8
    digest = hashlib.sha256()
    for _ in range(count):
        (length,) = struct.unpack_from("<I", data, at)
        name = data[at + 4:at + 4 + length]
        at += 4 + length
        (values,) = struct.unpack_from("<q", data, at)
        at += 8
        digest.update(name + data[at:at + 4 * values])
        at += 4 * values
    return digest.hexdigest()
for shard in sorted(pathlib.Path(sys.argv[1]).glob("rank-*.bin")):
    print(shard.name, tensors(shard))
PY

# 1 and 2.
for case in "tiny-dp2-tp2 4" "tiny-moe-ep2 2" "tiny-cp2-tp2 4"; do
  read -r plan ranks <<<"$case"
  declare -A variants=(
    [overlap]="--overlap-grad-reduce --ddp-bucket-size 4096"
    [after]="--no-overlap-grad-reduce --ddp-bucket-size 4096"
    [per-parameter]="--no-overlap-grad-reduce --ddp-bucket-size 1"
    [planner]=""
    [gather-after]="--no-overlap-param-gather --ddp-bucket-size 4096"
    [replicated]="--no-distributed-optimizer --no-overlap-grad-reduce --ddp-bucket-size 1"
    [replicated-overlap]="--no-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 4096"
  )
  for name in "${!variants[@]}"; do
    # shellcheck disable=SC2086 # the variant's flags are words
    if ! run "$ranks" --plan "$plans/$plan.json" --steps 3 ${variants[$name]} \
      --loss-log "$work/$plan-$name.log" --checkpoint-dir "$work/$plan-$name"; then
      fail "$plan ($name)"
      cat "$work/out"
      continue
    fi
    python3 "$work/tensors.py" "$work/$plan-$name/step-3" >"$work/$plan-$name.tensors"
  done
  for name in after per-parameter planner gather-after replicated replicated-overlap; do
    cmp -s <(grep -o '"loss_bits": "[^"]*"' "$work/$plan-overlap.log") \
      <(grep -o '"loss_bits": "[^"]*"' "$work/$plan-$name.log") ||
      fail "$plan: the losses of $name differ from the overlapped run's"
    cmp -s "$work/$plan-overlap.tensors" "$work/$plan-$name.tensors" ||
      fail "$plan: the checkpoint of $name differs from the overlapped run's"
  done
  [[ $(wc -l <"$work/$plan-overlap.log") == 3 ]] || fail "$plan: expected 3 logged losses"
  if ! run "$ranks" --plan "$plans/$plan.json" --steps 2 --verify --jitter-us 200 \
    --ddp-bucket-size 4096; then
    fail "$plan: --verify with overlapped buckets"
    cat "$work/out"
  elif [[ $(grep -c "bitwise equal on $ranks ranks" "$work/out") != 2 ]]; then
    fail "$plan: --verify did not report two verified steps"
    cat "$work/out"
  fi
  unset variants
done

# 1b. Resume across the two optimizers.
dp2=$plans/tiny-dp2-tp2.json
run 4 --plan "$dp2" --steps 5 --ddp-bucket-size 4096 --loss-log "$work/straight.log" ||
  fail "5 straight steps"
for first in --distributed-optimizer --no-distributed-optimizer; do
  second=--distributed-optimizer
  [[ $first == "$second" ]] && second=--no-distributed-optimizer
  rm -rf "$work/ckpt" "$work/resumed.log"
  if run 4 --plan "$dp2" --steps 3 --ddp-bucket-size 4096 "$first" --checkpoint-dir "$work/ckpt" \
    --loss-log "$work/resumed.log" &&
    run 4 --plan "$dp2" --steps 5 --ddp-bucket-size 4096 "$second" --checkpoint-dir "$work/ckpt" \
      --resume --loss-log "$work/resumed.log"; then
    cmp -s <(grep -o '"loss_bits": "[^"]*"' "$work/straight.log") \
      <(grep -o '"loss_bits": "[^"]*"' "$work/resumed.log") ||
      fail "3 steps $first + resume $second differ from 5 straight steps"
  else
    fail "3 steps $first + resume $second"
    cat "$work/out"
  fi
done

# 3. The trace.
check_trace() { # check_trace TRACE MODE
  python3 - "$@" <<'PY'
import json, sys
trace_file, mode = sys.argv[1], sys.argv[2]
events = json.load(open(trace_file))["traceEvents"]
threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
           if e["ph"] == "M" and e["name"] == "thread_name"}
slices = [e for e in events if e["ph"] == "X"]
problems, ranks = [], sorted({e["pid"] for e in slices})
for pid in ranks:
    early_steps = gathers_under_forward = 0
    for step in (0, 1, 2):
        mine = [e for e in slices if e["pid"] == pid and e["args"].get("step") == step]
        buckets = [e for e in mine if e["cat"] == "dp_bucket" and e["name"] == "dp_bucket"]
        gathers = [e for e in mine if e["cat"] == "dp_bucket" and e["name"] == "dp_param_gather"]
        if mode == "overlap" and step > 0:
            if len(gathers) != len(buckets):
                problems.append(f"rank {pid} step {step}: {len(gathers)} gathers, {len(buckets)} buckets")
            elif gathers:
                # The iteration (its execution) began before the last gather ended: the step
                # did not wait for the gathers. (Its first forward op may start later, after
                # the jitter's sleep, when the few tiny gathers are long done.)
                start = [e for e in mine if e["cat"] == "step" and e["name"] == "iteration"][0]["ts"]
                gathers_under_forward += start < max(e["ts"] + e["dur"] for e in gathers)
        if sorted(e["args"]["bucket"] for e in buckets) != list(range(len(buckets))) or len(buckets) < 3:
            problems.append(f"rank {pid} step {step}: buckets {[e['args'].get('bucket') for e in buckets]}")
            continue
        if any(threads.get((pid, e["tid"])) != "dp buckets" for e in buckets):
            problems.append(f"rank {pid} step {step}: a dp_bucket slice off the dp buckets thread")
        iteration = [e for e in mine if e["cat"] == "step" and e["name"] == "iteration"][0]
        end = iteration["ts"] + iteration["dur"]
        last_backward = max(e["ts"] + e["dur"] for e in mine if e["cat"] == "bwd")
        first = min(e["ts"] for e in buckets)
        if mode == "overlap":
            early_steps += first < last_backward
        elif first < end:
            problems.append(f"rank {pid} step {step}: a bucket started inside the iteration")
    if mode == "overlap" and early_steps == 0:
        problems.append(f"rank {pid}: no step's first bucket started before its last backward op ended")
    if mode == "overlap" and gathers_under_forward == 0:
        problems.append(f"rank {pid}: no step's iteration started before its last weight gather ended")
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
PY
}
for mode in overlap no-overlap; do
  # Jitter (a sleep of up to 300 us before every op) leaves the reduction thread room on a
  # machine whose cores other tests hold (ctest -j): the order of the slices is what is
  # checked, and a step's ops must not all finish before the thread is scheduled at all.
  # The dp link is emulated at 20 Mbit/s (runtime/comm/emulated_link.h: a 16 KiB bucket's
  # reduce-scatter or gather takes about 3 ms) so that the tiny model's gathers cannot all
  # be over before the next step starts unless the step waited for them.
  if ! run 4 --plan "$plans/tiny-dp2-tp2.json" --steps 3 --ddp-bucket-size 4096 \
    "--$mode-grad-reduce" --jitter-us 300 --emulate-link dp=20mbit@100us \
    --trace "$work/$mode.json"; then
    fail "--trace --$mode-grad-reduce"
    cat "$work/out"
  else
    check_trace "$work/$mode.json" "$mode" || fail "the $mode trace"
  fi
done

# 4. Bad input.
if run 4 --plan "$plans/tiny-dp2-tp2.json" --steps 1 --ddp-bucket-size 0; then
  fail "--ddp-bucket-size 0 accepted"
elif ! grep -q -- "--ddp-bucket-size" "$work/out"; then
  fail "--ddp-bucket-size 0: the message does not name the option"
  cat "$work/out"
fi

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "dp_overlap_test: all checks passed"
