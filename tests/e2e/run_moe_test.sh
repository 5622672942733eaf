#!/usr/bin/env bash
# dhelix-run end to end under mpirun: MoE layers with tensor parallelism, activation
# recompute and context parallelism (the EP-only MoE cases are in run_test.sh):
#   1. --verify under jitter on the shipped tiny-moe-ep2-tp2 (DP 2 x TP 2 with EP 2 and
#      expert tensor parallelism 2, 4 ranks) and tiny-moe-ep2-recompute (EP 2 with full
#      recompute, 2 ranks), and on EP 2 with selective recompute;
#   2. tiny-moe-ep2-tp2's loss falls over 30 steps; resume is exact for both examples;
#   3. recompute (full, selective) trains the storing plan's model: the losses of
#      tiny-moe-ep2 bit for bit;
#   4. TP 2 trains the model TP 1 trains (dropless, no load-balancing loss: each TP rank's
#      is that of its own rows, docs/runtime.md), with expert TP 2 and expert TP 1, and
#      with expert TP 2 without EP, to the 1e-5 relative of docs/kernels.md;
#   5. CP 2 with EP 2 (the EP group is the CP pair) equals CP 1 with EP 1 to 1e-5, and
#      TP 2 x CP 2 x EP 2 with expert TP 2 passes --verify with full and selective
#      recompute, with the storing plan's losses;
#   6. a shared expert under TP: --verify, TP 2 equals TP 1 as in 4., full recompute gives
#      the storing plan's losses; a width tp does not divide is refused by name before any
#      rank trains.
# Usage: run_moe_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=${1:?usage: run_moe_test.sh BIN_DIR SOURCE_DIR}
src=${2:?usage: run_moe_test.sh BIN_DIR SOURCE_DIR}
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
  mpirun --oversubscribe -np "$ranks" "$bin/dhelix-run" --data "$corpus" "$@" >"$work/out" 2>&1
}
verify() { # verify RANKS STEPS PLAN [ARGS...]: --verify under jitter, every step bitwise
  local ranks=$1 steps=$2 plan=$3
  shift 3
  if ! run "$ranks" --plan "$plan" --steps "$steps" --verify --jitter-us 200 "$@" ||
    [[ $(grep -c "bitwise equal on $ranks ranks" "$work/out") != "$steps" ]]; then
    fail "$(basename "$plan") --verify"
    cat "$work/out"
  fi
}
close() { # close TOLERANCE LOG_A LOG_B: the losses agree to TOLERANCE relative, step by step
  python3 - "$@" <<'PY'
import json, sys
tolerance = float(sys.argv[1])
a, b = ([json.loads(line)["loss"] for line in open(path)] for path in sys.argv[2:4])
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b)) if a else 1.0
print(f"{sys.argv[2].rsplit('/', 1)[-1]} vs {sys.argv[3].rsplit('/', 1)[-1]}: {a} {b}, "
      f"largest relative difference {worst:.2g}")
sys.exit(0 if a and len(a) == len(b) and worst <= tolerance else 1)
PY
}
# moe_job OUT TP EXPERT_TP CAPACITY_FACTOR AUX_COEFF [DP CP]: tiny-moe-ep2 (EP 2) changed.
moe_job() {
  python3 - "$src/examples/jobs/tiny-moe-ep2.json" "$src/examples/models/llama-tiny-moe.json" "$@" <<'PY'
import json, os, sys
job, model = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
out, tp, etp, cf, aux = sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])
model["moe"].update(capacity_factor=cf, aux_loss_coeff=aux)
cluster = os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), job["cluster"])
job.update(name=os.path.basename(out)[:-5], model=model, cluster=cluster)
job["parallel"].update(tp=tp, sp=tp > 1, expert_tp=etp)
if len(sys.argv) > 9:
    job["parallel"].update(dp=int(sys.argv[8]), cp=int(sys.argv[9]))
json.dump(job, open(out, "w"))
PY
}
plan_job() { # plan_job NAME ARGS...: moe_job $work/NAME-job.json ARGS, planned to $work/NAME.json
  local name=$1
  shift
  moe_job "$work/$name-job.json" "$@" &&
    "$bin/dhelix-plan" "$work/$name-job.json" -o "$work/$name.json" >/dev/null ||
    fail "planning $name"
}

# 1. --verify under jitter.
ep2tp2=$plans/tiny-moe-ep2-tp2.json
recompute=$plans/tiny-moe-ep2-recompute.json
verify 4 2 "$ep2tp2"
verify 2 2 "$recompute"
"$bin/dhelix-plan" "$src/examples/jobs/tiny-moe-ep2.json" --recompute-granularity selective \
  -o "$work/selective.json" >/dev/null || fail "planning tiny-moe-ep2 with selective recompute"
verify 2 2 "$work/selective.json"

# 2. The loss falls (30 steps of TP 2 x EP 2), and resume is exact.
if run 4 --plan "$ep2tp2" --steps 30 --loss-log "$work/tp2-loss.log"; then
  python3 - "$work/tp2-loss.log" <<'PY' || fail "tiny-moe-ep2-tp2: the loss did not fall enough"
import json, sys
losses = [json.loads(line)["loss"] for line in open(sys.argv[1])]
print(f"tiny-moe-ep2-tp2: loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps")
sys.exit(0 if len(losses) == 30 and losses[-1] < 0.75 * losses[0] else 1)
PY
else
  fail "training tiny-moe-ep2-tp2"
  cat "$work/out"
fi
for case in "tiny-moe-ep2-tp2 4" "tiny-moe-ep2-recompute 2"; do
  read -r name ranks <<<"$case"
  run "$ranks" --plan "$plans/$name.json" --steps 4 --loss-log "$work/$name-straight.log" ||
    fail "$name: 4 straight steps"
  run "$ranks" --plan "$plans/$name.json" --steps 2 --checkpoint-dir "$work/$name-ckpt" \
    --loss-log "$work/$name-resumed.log" &&
    run "$ranks" --plan "$plans/$name.json" --steps 4 --checkpoint-dir "$work/$name-ckpt" --resume \
      --loss-log "$work/$name-resumed.log" || fail "$name: 2 steps and a resume to 4"
  cmp -s "$work/$name-straight.log" "$work/$name-resumed.log" ||
    fail "$name: resumed losses differ from the straight run"
done

# 3. Recompute trains the storing plan's model, bit for bit.
run 2 --plan "$plans/tiny-moe-ep2.json" --steps 4 --loss-log "$work/stored.log" ||
  fail "tiny-moe-ep2: 4 steps"
cmp -s "$work/stored.log" "$work/tiny-moe-ep2-recompute-straight.log" ||
  fail "full recompute: losses differ from the storing plan's"
run 2 --plan "$work/selective.json" --steps 4 --loss-log "$work/selective.log" ||
  fail "selective recompute: 4 steps"
cmp -s "$work/stored.log" "$work/selective.log" ||
  fail "selective recompute: losses differ from the storing plan's"

# 4. TP 2 (expert TP 2 and 1) trains the TP 1 model: dropless and without the
#    load-balancing loss, whose value under TP is each rank's own rows' (it moves the loss
#    by about 1e-4; a missing TP sum of an expert's or the router's gradient by more).
plan_job tp1 1 1 0 0
plan_job tp2-etp2 2 2 0 0
plan_job tp2-etp1 2 1 0 0
# Also without EP (ep 1: every rank all 4 experts; the expert-TP exchanges alone).
moe_job "$work/tp2-etp2-ep1-job.json" 2 2 0 0 &&
  python3 - "$work/tp2-etp2-ep1-job.json" <<'PY' &&
import json, sys
job = json.load(open(sys.argv[1]))
job["parallel"]["ep"] = 1
json.dump(job, open(sys.argv[1], "w"))
PY
  "$bin/dhelix-plan" "$work/tp2-etp2-ep1-job.json" -o "$work/tp2-etp2-ep1.json" >/dev/null ||
  fail "planning tp2-etp2-ep1"
run 2 --plan "$work/tp1.json" --steps 6 --loss-log "$work/tp1.log" || fail "tp 1: 6 steps"
for variant in etp2 etp1 etp2-ep1; do
  run 4 --plan "$work/tp2-$variant.json" --steps 6 --loss-log "$work/tp2-$variant.log" ||
    fail "tp 2, $variant: 6 steps"
  close 1e-5 "$work/tp2-$variant.log" "$work/tp1.log" ||
    fail "tp 2 with $variant: losses differ from tp 1's"
done
verify 4 2 "$work/tp2-etp2-ep1.json"

# 5. Context parallelism: CP 2 x EP 2 (DP 1) equals CP 1 x EP 1 (dropless, no
#    load-balancing loss, as in 4.); TP 2 x CP 2 x EP 2 with recompute.
plan_job cp2 1 1 0 0 1 2
moe_job "$work/cp1-job.json" 1 1 0 0 1 1 &&
  python3 - "$work/cp1-job.json" <<'PY' &&
import json, sys
job = json.load(open(sys.argv[1]))
job["parallel"]["ep"] = 1
json.dump(job, open(sys.argv[1], "w"))
PY
  "$bin/dhelix-plan" "$work/cp1-job.json" -o "$work/cp1.json" >/dev/null || fail "planning cp1"
verify 2 4 "$work/cp2.json" --loss-log "$work/cp2.log"
run 1 --plan "$work/cp1.json" --steps 4 --loss-log "$work/cp1.log" || fail "cp 1: 4 steps"
close 1e-5 "$work/cp2.log" "$work/cp1.log" || fail "cp 2 x ep 2: losses differ from cp 1's"
plan_job tp2-cp2 2 2 1.0 0.01 1 2
run 4 --plan "$work/tp2-cp2.json" --steps 3 --loss-log "$work/tp2-cp2.log" ||
  fail "tp 2 x cp 2: 3 steps"
for granularity in full selective; do
  "$bin/dhelix-plan" "$work/tp2-cp2-job.json" --recompute-granularity "$granularity" \
    -o "$work/tp2-cp2-$granularity.json" >/dev/null || fail "planning tp2-cp2 $granularity"
  verify 4 3 "$work/tp2-cp2-$granularity.json" --loss-log "$work/tp2-cp2-$granularity.log"
  cmp -s "$work/tp2-cp2.log" "$work/tp2-cp2-$granularity.log" ||
    fail "tp 2 x cp 2 with $granularity recompute: losses differ from the storing plan's"
done

# 6. A shared expert (width 64) under TP, tensor-parallel like a dense MLP: --verify under
#    jitter, and TP 2 (expert TP 2 and 1) trains the TP 1 model as in 4.; a width that tp
#    does not divide (63) is refused by name on every rank before training.
shared() { # shared JOB WIDTH: the job's model gets a shared expert of WIDTH
  python3 - "$@" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
job["model"]["moe"]["shared_expert_ffn_hidden_size"] = int(sys.argv[2])
json.dump(job, open(sys.argv[1], "w"))
PY
}
for name in tp1 tp2-etp2 tp2-etp1; do
  cp "$work/$name-job.json" "$work/shared-$name-job.json"
  shared "$work/shared-$name-job.json" 64 &&
    "$bin/dhelix-plan" "$work/shared-$name-job.json" -o "$work/shared-$name.json" >/dev/null ||
    fail "planning shared-$name"
done
run 2 --plan "$work/shared-tp1.json" --steps 4 --loss-log "$work/shared-tp1.log" ||
  fail "shared expert, tp 1: 4 steps"
for etp in 2 1; do
  verify 4 4 "$work/shared-tp2-etp$etp.json" --loss-log "$work/shared-tp2-etp$etp.log"
  close 1e-5 "$work/shared-tp2-etp$etp.log" "$work/shared-tp1.log" ||
    fail "shared expert, tp 2 with expert tp $etp: losses differ from tp 1's"
done
# With full recompute (the shared expert's TP exchanges repeated too): the same losses.
"$bin/dhelix-plan" "$work/shared-tp2-etp2-job.json" --recompute-granularity full \
  -o "$work/shared-full.json" >/dev/null || fail "planning shared-tp2-etp2 with full recompute"
verify 4 4 "$work/shared-full.json" --loss-log "$work/shared-full.log"
cmp -s "$work/shared-tp2-etp2.log" "$work/shared-full.log" ||
  fail "shared expert, tp 2, full recompute: losses differ from the storing plan's"
cp "$work/tp2-etp2-job.json" "$work/shared63-job.json"
shared "$work/shared63-job.json" 63 &&
  "$bin/dhelix-plan" "$work/shared63-job.json" -o "$work/shared63.json" >/dev/null ||
  fail "planning a shared expert of width 63 with tp 2"
if run 4 --plan "$work/shared63.json" --steps 1 --checkpoint-dir "$work/bad"; then
  fail "a shared expert of width 63 with tp 2 trained; expected a refusal"
elif ! grep -qF "dhelix-run does not run mixture-of-experts layers (4 experts, top-2, ep = 2) with a shared expert of width 63 that tp = 2 does not divide yet" "$work/out"; then
  fail "a shared expert of width 63 with tp 2: the refusal lacks its reason"
  cat "$work/out"
fi
[[ ! -e $work/bad ]] || fail "a refused run wrote a checkpoint"

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "all MoE run tests passed"
