#!/usr/bin/env bash
# dhelix-run with fully sharded data parallelism (Megatron-FSDP's optim_grads_params,
# runtime/model/fsdp_layers.h) under mpirun, on examples/jobs/tiny-fsdp-dp4.json (DP 4 on
# 4 ranks), with reshard_after_forward (the default) and without:
#   1. --verify: the co-executed schedule and the sequential one give bitwise-equal losses
#      and gradients under random delays before every op;
#   2. 20 steps equal 20 steps of the same job with plain data parallelism (no FSDP, the
#      distributed optimizer) within docs/kernels.md's FSDP tolerance,
#      |fsdp - dp| <= 1e-5 |dp| per step's loss, and the loss falls;
#   3. 4 steps in one run == 2 steps + a resume of 2 more, bit for bit; and a checkpoint of
#      the FSDP run holds the same tensors (names, sizes) as the plain run's;
#   4. the arena's live peak is lower with reshard_after_forward than without; and the same
#      4 steps with every buffer its own allocation (DHELIX_ACTIVATION_ARENA=
#      separate), bit for bit: the gathered weights' places in the arena change nothing;
# with selective and full activation recompute it trains with --verify too (full: the
# storing plan's losses bit for bit, no third gather); on an emulated dp link it
# gives the same bits; optim_grads (no ops) gives plain DP's bits; DP 2 x PP 2 and DP 2 x
# TP 2 pass --verify; DP 2 x TP 2 with sequence parallelism passes --verify, equals the
# unsharded SP run over 20 steps and resumes exactly; a mixture of experts plans (the
# experts' collectives over the expert-data-parallel group) and its plan checks, and
# dhelix-run refuses it by name; --backend cuda is not refused.
# Usage: run_fsdp_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=${1:?usage: run_fsdp_test.sh BIN_DIR SOURCE_DIR}
src=${2:?usage: run_fsdp_test.sh BIN_DIR SOURCE_DIR}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
job=$src/examples/jobs/tiny-fsdp-dp4.json
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
run() { # run ARGS...: dhelix-run on 4 ranks, output in $work/out
  mpirun --oversubscribe -np 4 "$bin/dhelix-run" --data "$src/examples/data/corpus.txt" \
    "$@" >"$work/out" 2>&1
}

# The same job without FSDP: plain DP 4 with the distributed optimizer.
python3 - "$job" "$work/dp.json" <<'PY'
import json, os, sys
path, out = sys.argv[1:3]
job = json.load(open(path))
for key in ("use_megatron_fsdp", "data_parallel_sharding_strategy"):
    job["parallel"].pop(key, None)
for key in ("model", "cluster"):  # relative to the example's directory
    job[key] = os.path.abspath(os.path.join(os.path.dirname(path), job[key]))
json.dump(job, open(out, "w"), indent=2)
PY
"$bin/dhelix-plan" "$work/dp.json" -o "$work/dp-plan.json" >/dev/null || fail "planning plain DP"
run --plan "$work/dp-plan.json" --steps 20 --loss-log "$work/dp.log" || {
  fail "20 steps of plain DP"
  cat "$work/out"
}
run --plan "$work/dp-plan.json" --steps 1 --checkpoint-dir "$work/dp-ckpt" ||
  fail "a checkpoint of plain DP"

for case in reshard kept; do
  plan=$work/$case.json
  flags=()
  [[ $case == kept ]] && flags+=(--no-fsdp-reshard-after-forward)
  "$bin/dhelix-plan" "$job" "${flags[@]}" -o "$plan" >/dev/null || fail "planning $case"
  grep -q '"fwd.fsdp_gather"' "$plan" || fail "the $case plan has no fwd.fsdp_gather"
  if [[ $case == reshard ]]; then
    grep -q '"bwd.fsdp_gather"' "$plan" || fail "the reshard plan has no bwd.fsdp_gather"
  elif grep -q '"bwd.fsdp_gather"' "$plan"; then
    fail "the kept plan gathers again in the backward"
  fi
  # 1. Equivalence of the schedules.
  if ! run --plan "$plan" --steps 2 --verify --jitter-us 200; then
    fail "$case --verify"
    cat "$work/out"
  elif [[ $(grep -c "bitwise equal on 4 ranks" "$work/out") != 2 ]]; then
    fail "$case --verify did not report two verified steps"
    cat "$work/out"
  fi
  # 2. It trains as plain DP does.
  run --plan "$plan" --steps 20 --loss-log "$work/$case.log" || {
    fail "20 steps of $case"
    cat "$work/out"
  }
  grep "^memory rank 0" "$work/out" | tee "$work/$case.memory" | sed "s/^/$case: /"
  python3 - "$case" "$work/$case.log" "$work/dp.log" <<'PY' || fail "$case's losses differ from plain DP's"
import json, sys
kind = sys.argv[1]
x, dp = ([json.loads(line)["loss"] for line in open(path)] for path in sys.argv[2:4])
worst = max(abs(a - b) / b for a, b in zip(x, dp))
print(f"fsdp {kind}: loss {x[0]:.4f} -> {x[-1]:.4f}; largest relative difference to plain DP {worst:.2g}")
sys.exit(0 if len(x) == len(dp) == 20 and worst <= 1e-5 and x[-1] < 0.9 * x[0] else 1)
PY
  # 3. Resume: 4 steps == 2 steps + resume to 4.
  rm -rf "$work/ckpt" "$work/resumed.log" "$work/straight.log"  # --loss-log appends
  run --plan "$plan" --steps 4 --loss-log "$work/straight.log" || fail "$case: 4 straight steps"
  run --plan "$plan" --steps 2 --checkpoint-dir "$work/ckpt" --loss-log "$work/resumed.log" ||
    fail "$case: 2 steps with a checkpoint"
  run --plan "$plan" --steps 4 --checkpoint-dir "$work/ckpt" --resume \
    --loss-log "$work/resumed.log" || {
    fail "$case: resume to step 4"
    cat "$work/out"
  }
  cmp -s "$work/straight.log" "$work/resumed.log" ||
    fail "$case: resumed losses differ from the straight run"
  # 4. The gathered buffers in the arena change no bit: each its own allocation instead.
  rm -f "$work/separate.log"
  DHELIX_ACTIVATION_ARENA=separate run --plan "$plan" --steps 4 --loss-log "$work/separate.log" ||
    fail "$case: 4 steps without the arena"
  cmp -s "$work/straight.log" "$work/separate.log" ||
    fail "$case: the arena's losses differ from separate buffers'"
done

# The gathered buffers are freed with their spans: resharding after the forward keeps fewer
# of them live than keeping the gathered weights to the backward (runtime/model/fsdp_layers.h).
python3 - "$work/reshard.memory" "$work/kept.memory" <<'PY' || fail "reshard_after_forward does not lower the live peak"
import re, sys
peak = [float(re.search(r"live peak ([0-9.]+) MiB", open(p).read()).group(1)) for p in sys.argv[1:3]]
print(f"activation arena live peak: reshard {peak[0]:.3f} MiB, kept {peak[1]:.3f} MiB")
sys.exit(0 if peak[0] < peak[1] else 1)
PY

# The checkpoint keeps the unsharded format: the same tensors as plain DP's, per rank.
python3 - "$work/ckpt/step-4/rank-1.bin" "$work/dp-ckpt/step-1/rank-1.bin" <<'PY' ||
import struct, sys
def tensors(path):  # docs/data-and-checkpoints.md, "Rank shard": 192 header bytes
    data = open(path, "rb").read()
    (count,) = struct.unpack_from("<q", data, 192)
    at, out = 200, []
    for _ in range(count):
        (length,) = struct.unpack_from("<I", data, at)
        name = data[at + 4 : at + 4 + length].decode()
        (values,) = struct.unpack_from("<q", data, at + 4 + length)
        out.append((name, values))
        at += 4 + length + 8 + 4 * values
    return out
fsdp, plain = tensors(sys.argv[1]), tensors(sys.argv[2])
print(f"checkpoint: {len(fsdp)} tensors (FSDP), {len(plain)} (plain DP)")
sys.exit(0 if fsdp and fsdp == plain else 1)
PY
  fail "the FSDP checkpoint's tensors (names, sizes) differ from plain DP's"

# Activation recompute. Selective: the repeated core attention reads no weights; the
# backward reads the gathered ones. Full: the repeated forward reads the backward's gathered
# weights (reshard) or the kept ones, gathering nothing of its own (the plan has no
# bwd.recompute.fsdp_gather); it recomputes the same values, so its 4 losses are the storing
# plan's bit for bit.
for granularity in selective full; do
  for case in reshard kept; do
    plan=$work/recompute-$granularity-$case.json
    flags=(--recompute-granularity "$granularity")
    [[ $case == kept ]] && flags+=(--no-fsdp-reshard-after-forward)
    "$bin/dhelix-plan" "$job" "${flags[@]}" -o "$plan" >/dev/null ||
      fail "planning FSDP ($case) with $granularity recompute"
    if ! run --plan "$plan" --steps 2 --verify --jitter-us 200; then
      fail "FSDP ($case) with $granularity recompute --verify"
      cat "$work/out"
    elif ! grep -q "bitwise equal on 4 ranks" "$work/out"; then
      fail "FSDP ($case) with $granularity recompute: --verify did not report a verified step"
    fi
    [[ $granularity == full ]] || continue
    grep -q '"bwd.recompute.gemm_qkv"' "$plan" || fail "the full recompute plan repeats no forward"
    grep -q '"bwd.recompute.fsdp_gather"' "$plan" && fail "full recompute ($case) gathers a third time"
    rm -f "$work/recompute.log"
    run --plan "$plan" --steps 4 --loss-log "$work/recompute.log" || {
      fail "4 steps of FSDP ($case) with full recompute"
      cat "$work/out"
    }
    head -4 "$work/$case.log" | cmp -s - "$work/recompute.log" ||
      fail "FSDP ($case) with full recompute: losses differ from the storing plan's"
  done
done

# On an emulated dp link the gathers and reduce-scatters cost wire time and change no bit.
rm -f "$work/emulated.log"
run --plan "$work/reshard.json" --steps 4 --emulate-link dp=200mbit@50us --jitter-us 100 \
  --loss-log "$work/emulated.log" || {
  fail "FSDP on an emulated link"
  cat "$work/out"
}
grep -q "on an emulated link" "$work/out" || fail "the emulated run does not say its link"
head -4 "$work/reshard.log" | cmp -s - "$work/emulated.log" ||
  fail "FSDP on an emulated link: losses differ from the shared-memory run's"

# optim_grads (ZeRO-2) adds no ops: it runs as the distributed optimizer, plain DP's bits.
"$bin/dhelix-plan" "$job" --data-parallel-sharding-strategy optim_grads -o "$work/zero2.json" \
  >/dev/null || fail "planning optim_grads"
rm -f "$work/zero2.log"
run --plan "$work/zero2.json" --steps 3 --loss-log "$work/zero2.log" || fail "3 steps of optim_grads"
head -3 "$work/dp.log" | cmp -s - "$work/zero2.log" || fail "optim_grads differs from plain DP"

# Other shapes: DP 2 x PP 2 and DP 2 x TP 2 (each stage's, each TP rank's layers sharded
# over its DP group), --verify under jitter.
for shape in "--dp 2 --pp 2" "--dp 2 --tp 2"; do
  # shellcheck disable=SC2086 # the shape's flags
  "$bin/dhelix-plan" "$job" $shape -o "$work/shape.json" >/dev/null || fail "planning $shape"
  if ! run --plan "$work/shape.json" --steps 1 --verify --jitter-us 200; then
    fail "$shape --verify"
    cat "$work/out"
  elif ! grep -q "bitwise equal on 4 ranks" "$work/out"; then
    fail "$shape --verify did not report a verified step"
  fi
done

# Sequence parallelism (DP 2 x TP 2): the norm gains' gradients, partial over TP, are
# summed on the shard after the reduce-scatters (runtime/train/cpu_engine.cc). --verify under
# jitter, 20 steps equal to the unsharded SP run within docs/kernels.md's tolerance with the
# loss falling, and resume bit for bit.
sp=(--dp 2 --tp 2 --sequence-parallel)
"$bin/dhelix-plan" "$job" "${sp[@]}" -o "$work/sp.json" >/dev/null ||
  fail "planning FSDP with sequence parallelism"
"$bin/dhelix-plan" "$work/dp.json" "${sp[@]}" -o "$work/sp-dp.json" >/dev/null ||
  fail "planning plain DP with sequence parallelism"
if ! run --plan "$work/sp.json" --steps 2 --verify --jitter-us 200; then
  fail "FSDP with sequence parallelism --verify"
  cat "$work/out"
elif [[ $(grep -c "bitwise equal on 4 ranks" "$work/out") != 2 ]]; then
  fail "FSDP with sequence parallelism: --verify did not report two verified steps"
  cat "$work/out"
fi

# A mixture of experts (tiny-moe-ep2 with dp 4, ep 2: edp = 4 / 2 = 2) plans with the
# experts' own gathers and reduce-scatter and the plan checks; dhelix-run refuses it by name
# (the plan names a collective's group by dimension, not the expert-data-parallel group).
python3 - "$src/examples/jobs/tiny-moe-ep2.json" "$work/moe.json" <<'PY'
import json, os, sys
path, out = sys.argv[1:3]
job = json.load(open(path))
job["parallel"].update(dp=4, global_batch_size=16, use_megatron_fsdp=True,
                       data_parallel_sharding_strategy="optim_grads_params")
for key in ("model", "cluster"):
    job[key] = os.path.abspath(os.path.join(os.path.dirname(path), job[key]))
json.dump(job, open(out, "w"), indent=2)
PY
"$bin/dhelix-plan" "$work/moe.json" -o "$work/moe-plan.json" >/dev/null || fail "planning FSDP with MoE"
for op in fwd.fsdp_expert_gather bwd.fsdp_expert_gather bwd.fsdp_expert_reduce_scatter; do
  grep -q "\"$op\"" "$work/moe-plan.json" || fail "the MoE FSDP plan has no $op"
done
"$bin/dhelix-plan" --check "$work/moe-plan.json" >"$work/out" 2>&1 || {
  fail "the MoE FSDP plan does not check"
  cat "$work/out"
}
if run --plan "$work/moe-plan.json" --steps 1; then
  fail "FSDP with MoE ran"
elif ! grep -qF "is not run with mixture-of-experts layers (the experts' gathers and reduce-scatters run over the expert-data-parallel group" "$work/out"; then
  fail "FSDP with MoE: message lacks the reason"
  cat "$work/out"
fi

rm -f "$work/sp.log" "$work/sp-dp.log" "$work/sp-straight.log" "$work/sp-resumed.log"
run --plan "$work/sp.json" --steps 20 --loss-log "$work/sp.log" || {
  fail "20 steps of FSDP with sequence parallelism"
  cat "$work/out"
}
run --plan "$work/sp-dp.json" --steps 20 --loss-log "$work/sp-dp.log" || {
  fail "20 steps of plain DP with sequence parallelism"
  cat "$work/out"
}
python3 - "$work/sp.log" "$work/sp-dp.log" <<'PY' || fail "FSDP with SP: losses differ from unsharded SP's"
import json, sys
x, dp = ([json.loads(line)["loss"] for line in open(path)] for path in sys.argv[1:3])
worst = max(abs(a - b) / b for a, b in zip(x, dp))
print(f"fsdp sp: loss {x[0]:.4f} -> {x[-1]:.4f}; largest relative difference to unsharded SP {worst:.2g}")
sys.exit(0 if len(x) == len(dp) == 20 and worst <= 1e-5 and x[-1] < 0.9 * x[0] else 1)
PY
run --plan "$work/sp.json" --steps 4 --loss-log "$work/sp-straight.log" || fail "sp: 4 straight steps"
rm -rf "$work/sp-ckpt"
run --plan "$work/sp.json" --steps 2 --checkpoint-dir "$work/sp-ckpt" \
  --loss-log "$work/sp-resumed.log" || fail "sp: 2 steps with a checkpoint"
run --plan "$work/sp.json" --steps 4 --checkpoint-dir "$work/sp-ckpt" --resume \
  --loss-log "$work/sp-resumed.log" || {
  fail "sp: resume to step 4"
  cat "$work/out"
}
cmp -s "$work/sp-straight.log" "$work/sp-resumed.log" ||
  fail "sp: resumed losses differ from the straight run"

# FSDP on the CUDA backend is not refused: the engine runs the plan's gathers and
# reduce-scatters on NCCL (tests/device/simulated_fsdp_run_test.cc holds its calls). Without
# a GPU the run stops at the device, not at an FSDP refusal.
if ! "$bin/dhelix-run" --backend cuda --plan "$work/reshard.json" \
  --data "$src/examples/data/corpus.txt" --steps 1 >"$work/out" 2>&1; then
  if grep -qF "fully sharded data parallelism" "$work/out"; then
    fail "FSDP on --backend cuda is refused"
    cat "$work/out"
  fi
fi

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "dhelix-run FSDP: all passed"
