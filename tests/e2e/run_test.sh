#!/usr/bin/env bash
# dhelix-run end to end under mpirun, on the shipped tiny CPU plans (examples/plans/tiny-*):
#   1. --verify: the plan's co-executed schedule and the sequential one give bitwise-equal
#      losses and gradients, for TP2 x PP2 (4 ranks), DP2 x TP2 (4 ranks) and TP2 (2 ranks),
#      with random delays before every op (--jitter-us) so that timing cannot hide a missing
#      dependency (removing the cross-stream waits of the interpreter makes this fail);
#   2. training on the shipped corpus lowers the loss; interleaved stages
#      (tiny-tp2-pp2-interleaved) give the W plan's losses bit for bit;
#   3. 6 steps in one run == 3 steps + a resume of 3 more, bit for bit;
#   4. activation recompute, full and selective: --verify, and the storing plan's losses;
#   5. context parallelism (tiny-cp2-tp2, CP 2 x TP 2 on 4 ranks; --verify in 1.): the
#      losses of 30 steps equal tiny-tp2's (CP 1) within 1e-5 and fall; resume is exact;
#      with full and selective recompute --verify holds and the losses are the storing
#      plan's bit for bit;
#   6. MoE with expert parallelism (tiny-moe-ep2, tiny-moe-ep2-pp2; --verify in 1): the loss
#      falls, resume is exact, EP 2 trains the model EP 1 trains (DP 2 and DP 4, where the
#      expert-data-parallel groups sum the experts' gradients; with a shared expert), and
#      capacity drops tokens;
#   7. bad input (plan for another job, too few ranks, missing files, resume without a
#      checkpoint, a corrupted plan the checker refuses) gives a clear error, a non-zero
#      status and no checkpoint. MoE with TP, recompute and CP: run_moe_test.sh; CP and MoE
#      on the CUDA backend: run_cuda_test.sh.
# Usage: run_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=${1:?usage: run_test.sh BIN_DIR SOURCE_DIR}
src=${2:?usage: run_test.sh BIN_DIR SOURCE_DIR}
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
expect_failure() { # expect_failure RANKS FRAGMENT ARGS...
  local ranks=$1 fragment=$2
  shift 2
  if run "$ranks" "$@"; then
    fail "dhelix-run $* succeeded; expected an error containing: $fragment"
  elif ! grep -qF -- "$fragment" "$work/out"; then
    fail "dhelix-run $*: message lacks '$fragment':"
    cat "$work/out"
  fi
}

# 1. Equivalence of the schedules.
# tiny-tp2-pp2 is the W, tiny-tp2-pp2-v the V with its split backwards, tiny-tp2-pp2-interleaved
# Megatron's interleaved stages with SI blocks (planner/dhelix_shapes.h).
for case in "tiny-tp2-pp2 4" "tiny-tp2-pp2-v 4" "tiny-tp2-pp2-interleaved 4" "tiny-dp2-tp2 4" "tiny-tp2 2" "tiny-cp2-tp2 4" \
  "tiny-moe-ep2 2" "tiny-moe-ep2-pp2 4"; do
  read -r plan ranks <<<"$case"
  if ! run "$ranks" --plan "$plans/$plan.json" --steps 2 --verify --jitter-us 200; then
    fail "$plan --verify"
    cat "$work/out"
  elif [[ $(grep -c "bitwise equal on $ranks ranks" "$work/out") != 2 ]]; then
    fail "$plan --verify did not report two verified steps"
    cat "$work/out"
  fi
done

# 2. The loss falls: 30 steps of TP2 on the corpus.
if run 2 --plan "$plans/tiny-tp2.json" --steps 30 --loss-log "$work/loss.log"; then
  python3 - "$work/loss.log" <<'PY' || fail "the loss did not fall enough"
import json, sys
losses = [json.loads(line)["loss"] for line in open(sys.argv[1])]
print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps")
sys.exit(0 if len(losses) == 30 and losses[-1] < 0.75 * losses[0] else 1)
PY
else
  fail "training tiny-tp2"
  cat "$work/out"
fi

# 2b. Interleaved stages train the model the W trains: 6 steps' losses equal the W plan's bit
# for bit (each micro-batch's gradient is accumulated in the same per-layer order).
if run 4 --plan "$plans/tiny-tp2-pp2.json" --steps 6 --loss-log "$work/w.log" &&
  run 4 --plan "$plans/tiny-tp2-pp2-interleaved.json" --steps 6 --loss-log "$work/il.log"; then
  python3 - "$work/w.log" "$work/il.log" <<'PY' || fail "interleaved stages' losses differ from the W's"
import json, sys
w, il = ([json.loads(line)["loss_bits"] for line in open(f)] for f in sys.argv[1:3])
print(f"interleaved vs W: {sum(a == b for a, b in zip(w, il))} of {len(w)} losses bitwise equal")
sys.exit(0 if len(w) == 6 and w == il else 1)
PY
else
  fail "training tiny-tp2-pp2 (W) or tiny-tp2-pp2-interleaved"
  cat "$work/out"
fi

# 3. Resume: 6 steps == 3 steps + resume to 6, compared bit for bit (loss_bits).
tp2pp2=$plans/tiny-tp2-pp2.json
run 4 --plan "$tp2pp2" --steps 6 --loss-log "$work/straight.log" || fail "6 straight steps"
run 4 --plan "$tp2pp2" --steps 3 --checkpoint-dir "$work/ckpt" --loss-log "$work/resumed.log" ||
  fail "3 steps with a checkpoint"
run 4 --plan "$tp2pp2" --steps 6 --checkpoint-dir "$work/ckpt" --resume \
  --loss-log "$work/resumed.log" || fail "resume to step 6"
grep -q "resumed from" "$work/out" || fail "the resumed run did not say so"
if ! cmp -s "$work/straight.log" "$work/resumed.log"; then
  fail "resumed losses differ from the straight run"
  diff "$work/straight.log" "$work/resumed.log" || true
fi
[[ -f $work/ckpt/step-6/manifest.json && $(cat "$work/ckpt/latest") == step-6 ]] ||
  fail "no published checkpoint step-6"

# 4. Activation recompute (the plan's bwd.recompute.* ops; the backward reads only the
#    recomputed activations): --verify under jitter on TP2 x PP2, and on TP2 the losses of
#    4 steps are bit for bit those of the storing plan, also when resumed after 2 steps.
for granularity in full selective; do
  for job in tiny-tp2-pp2 tiny-tp2; do
    "$bin/dhelix-plan" "$src/examples/jobs/$job.json" --recompute-granularity "$granularity" \
      -o "$work/$job-$granularity.json" >/dev/null || fail "planning $job with $granularity recompute"
  done
  if ! run 4 --plan "$work/tiny-tp2-pp2-$granularity.json" --steps 2 --verify --jitter-us 200 ||
    [[ $(grep -c "bitwise equal on 4 ranks" "$work/out") != 2 ]]; then
    fail "$granularity recompute --verify"
    cat "$work/out"
  fi
  rc=$work/tiny-tp2-$granularity.json
  [[ $granularity == full ]] && rc=$plans/tiny-tp2-recompute.json  # the shipped example
  run 2 --plan "$plans/tiny-tp2.json" --steps 4 --loss-log "$work/stored-$granularity.log" ||
    fail "4 storing steps"
  run 2 --plan "$rc" --steps 4 --loss-log "$work/recomputed-$granularity.log" ||
    fail "4 steps with $granularity recompute"
  cmp -s "$work/stored-$granularity.log" "$work/recomputed-$granularity.log" ||
    fail "$granularity recompute: losses differ from the storing plan's"
  if [[ $granularity == full ]]; then
    run 2 --plan "$rc" --steps 2 --checkpoint-dir "$work/rc-ckpt" --loss-log "$work/rc-resumed.log" &&
      run 2 --plan "$rc" --steps 4 --checkpoint-dir "$work/rc-ckpt" --resume \
        --loss-log "$work/rc-resumed.log" || fail "full recompute: 2 steps and a resume to 4"
    cmp -s "$work/stored-full.log" "$work/rc-resumed.log" ||
      fail "full recompute: resumed losses differ from the straight run"
  fi
done

# 5. Context parallelism: CP 2 trains as CP 1 does (the same sequences, each CP rank its two
#    chunks of each; docs/kernels.md states the tolerance), and resumes exactly.
cp2=$plans/tiny-cp2-tp2.json
if run 4 --plan "$cp2" --steps 30 --loss-log "$work/cp2.log"; then
  python3 - "$work/cp2.log" "$work/loss.log" <<'PY' || fail "CP 2's losses differ from CP 1's"
import json, sys
cp2, cp1 = ([json.loads(line)["loss"] for line in open(path)] for path in sys.argv[1:3])
worst = max(abs(a - b) / b for a, b in zip(cp2, cp1))
print(f"CP 2: loss {cp2[0]:.4f} -> {cp2[-1]:.4f}; largest relative difference to CP 1 {worst:.2g}")
sys.exit(0 if len(cp2) == len(cp1) == 30 and worst <= 1e-5 and cp2[-1] < 0.75 * cp2[0] else 1)
PY
else
  fail "training tiny-cp2-tp2"
  cat "$work/out"
fi
run 4 --plan "$cp2" --steps 4 --loss-log "$work/cp2-straight.log" || fail "CP 2: 4 straight steps"
run 4 --plan "$cp2" --steps 2 --checkpoint-dir "$work/cp2-ckpt" --loss-log "$work/cp2-resumed.log" &&
  run 4 --plan "$cp2" --steps 4 --checkpoint-dir "$work/cp2-ckpt" --resume \
    --loss-log "$work/cp2-resumed.log" || fail "CP 2: 2 steps and a resume to 4"
cmp -s "$work/cp2-straight.log" "$work/cp2-resumed.log" ||
  fail "CP 2: resumed losses differ from the straight run"
# CP 4 (messages carrying a K/V block and a dK/dV partial at once) and DP 2 x CP 2 (the
# gradients summed over DP x CP), 4 ranks with tp 1: --verify under jitter, and 10 steps'
# losses within 1e-5 of the same job planned with cp 1.
for case in "cp4 1 --cp 4" "dp2-cp2 2 --dp 2 --cp 2"; do
  read -r name ref_ranks flags <<<"$case"
  # shellcheck disable=SC2086  # the flags are words; the reference drops the last two
  "$bin/dhelix-plan" "$src/examples/jobs/tiny-tp2.json" --tp 1 --no-sp $flags \
    -o "$work/$name.json" >/dev/null 2>&1 &&
    "$bin/dhelix-plan" "$src/examples/jobs/tiny-tp2.json" --tp 1 --no-sp ${flags%--cp *} \
      -o "$work/$name-ref.json" >/dev/null 2>&1 || fail "planning $name"
  if run 4 --plan "$work/$name.json" --steps 10 --verify --jitter-us 200 \
    --loss-log "$work/$name.log" && [[ $(grep -c "bitwise equal on 4 ranks" "$work/out") == 10 ]] &&
    run "$ref_ranks" --plan "$work/$name-ref.json" --steps 10 --loss-log "$work/$name-ref.log"; then
    python3 - "$work/$name.log" "$work/$name-ref.log" <<'PY' || fail "$name: losses differ from cp 1's"
import json, sys
a, b = ([json.loads(line)["loss"] for line in open(path)] for path in sys.argv[1:3])
sys.exit(0 if len(a) == len(b) == 10 and max(abs(x - y) / y for x, y in zip(a, b)) <= 1e-5 else 1)
PY
  else
    fail "$name: --verify or the cp 1 run"
    cat "$work/out"
  fi
done
# With recompute (the ring repeated in the backward): --verify under jitter, and the losses
# of the storing plan bit for bit.
for granularity in full selective; do
  "$bin/dhelix-plan" "$src/examples/jobs/tiny-cp2-tp2.json" --recompute-granularity "$granularity" \
    -o "$work/cp2-$granularity.json" >/dev/null || fail "planning tiny-cp2-tp2 with $granularity recompute"
  if ! run 4 --plan "$work/cp2-$granularity.json" --steps 4 --verify --jitter-us 200 \
    --loss-log "$work/cp2-$granularity.log" ||
    [[ $(grep -c "bitwise equal on 4 ranks" "$work/out") != 4 ]]; then
    fail "CP 2 with $granularity recompute --verify"
    cat "$work/out"
  fi
  cmp -s "$work/cp2-straight.log" "$work/cp2-$granularity.log" ||
    fail "CP 2 with $granularity recompute: losses differ from the storing plan's"
done
# 6. MoE with expert parallelism.
# The loss falls: 30 steps of EP 2 on the corpus (the reported loss includes the
# load-balancing loss).
if run 2 --plan "$plans/tiny-moe-ep2.json" --steps 30 --loss-log "$work/moe-loss.log"; then
  python3 - "$work/moe-loss.log" <<'PY' || fail "tiny-moe-ep2: the loss did not fall enough"
import json, sys
losses = [json.loads(line)["loss"] for line in open(sys.argv[1])]
print(f"tiny-moe-ep2: loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps")
sys.exit(0 if len(losses) == 30 and losses[-1] < 0.75 * losses[0] else 1)
PY
else
  fail "training tiny-moe-ep2"
  cat "$work/out"
fi
# Resume: EP 2 x PP 2, 6 steps == 3 steps + resume to 6, bit for bit.
moepp=$plans/tiny-moe-ep2-pp2.json
run 4 --plan "$moepp" --steps 6 --loss-log "$work/moe-straight.log" || fail "moe: 6 straight steps"
run 4 --plan "$moepp" --steps 3 --checkpoint-dir "$work/moe-ckpt" --loss-log "$work/moe-resumed.log" &&
  run 4 --plan "$moepp" --steps 6 --checkpoint-dir "$work/moe-ckpt" --resume \
    --loss-log "$work/moe-resumed.log" || fail "moe: 3 steps and a resume to 6"
cmp -s "$work/moe-straight.log" "$work/moe-resumed.log" ||
  fail "tiny-moe-ep2-pp2: resumed losses differ from the straight run"
# EP 2 (each rank 2 of the 4 experts, tokens exchanged by all-to-all) trains the same model
# as EP 1 (every rank all 4 experts, no exchange) from the same data: equal losses over 4
# steps, to 1e-5 relative (measured bitwise equal; the expert weight gradients sum the
# rows of the two ranks in another order). A misrouted token or an expert gradient summed
# over the wrong group changes the loss at once. Then the same with capacity factor 0
# (dropless): the losses must differ from the first step, since capacity 1.0 drops token
# copies (the routing of the untrained router is unbalanced).
moe_job() { # moe_job EP CAPACITY_FACTOR OUT [DP [SHARED_EXPERT_FFN]]
  python3 - "$src/examples/jobs/tiny-moe-ep2.json" "$src/examples/models/llama-tiny-moe.json" "$@" <<'PY'
import json, os, sys
job, model = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
model["moe"]["capacity_factor"] = float(sys.argv[4])
cluster = os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), job["cluster"])
job.update(name=f"tiny-moe-ep{sys.argv[3]}-cf{sys.argv[4]}", model=model, cluster=cluster)
job["parallel"]["ep"] = int(sys.argv[3])
job["parallel"]["dp"] = int(sys.argv[6]) if len(sys.argv) > 6 else 2
if len(sys.argv) > 7:
    model["moe"]["shared_expert_ffn_hidden_size"] = int(sys.argv[7])
json.dump(job, open(sys.argv[5], "w"))
PY
}
for variant in "1 1.0" "2 0" "1 0"; do
  read -r ep cf <<<"$variant"
  moe_job "$ep" "$cf" "$work/moe-ep$ep-cf$cf-job.json" &&
    "$bin/dhelix-plan" "$work/moe-ep$ep-cf$cf-job.json" -o "$work/moe-ep$ep-cf$cf.json" >/dev/null &&
    run 2 --plan "$work/moe-ep$ep-cf$cf.json" --steps 4 --loss-log "$work/moe-ep$ep-cf$cf.log" ||
    fail "moe: 4 steps with ep $ep, capacity factor $cf"
done
run 2 --plan "$plans/tiny-moe-ep2.json" --steps 4 --loss-log "$work/moe-ep2-cf1.0.log" ||
  fail "moe: 4 steps of tiny-moe-ep2"
python3 - "$work" <<'PY' || fail "moe: EP 1 vs EP 2 or capacity dropping"
import json, sys
def losses(name):
    return [json.loads(line)["loss"] for line in open(f"{sys.argv[1]}/{name}.log")]
ok = True
# Dropless, EP 2 and EP 1 agree to 1e-5 at every step. With capacity dropping they agree
# exactly at step 1 (same weights, same routing) and to 1e-4 after: the expert gradients
# are summed in another order, and a gate weight that differs in its last bit can drop
# another copy, which moves the loss by about 2e-5 (seen on a fresh Debian 12 machine); an
# expert gradient summed over the wrong group moves it by about 7e-3.
for cf, tolerance in (("1.0", 1e-4), ("0", 1e-5)):
    ep1, ep2 = losses(f"moe-ep1-cf{cf}"), losses(f"moe-ep2-cf{cf}")
    close = (len(ep1) == len(ep2) == 4 and ep1[0] == ep2[0] and
             all(abs(a - b) <= tolerance * abs(a) for a, b in zip(ep1, ep2)))
    print(f"capacity factor {cf}: ep 1 {ep1}, ep 2 {ep2}")
    ok = ok and close
dropping, dropless = losses("moe-ep2-cf1.0"), losses("moe-ep2-cf0")
print(f"first loss with capacity 1.0 {dropping[0]!r}, dropless {dropless[0]!r}")
sys.exit(0 if ok and dropping[0] != dropless[0] else 1)
PY
# DP 4 with EP 2: the expert-data-parallel groups {0, 2} and {1, 3} sum the experts'
# gradients (with DP 2 x EP 2 they have one member); the same losses as DP 4 with EP 1.
# Dropless, so that a copy dropped for a last-bit difference cannot move the loss (above).
for ep in 1 2; do
  moe_job "$ep" 0 "$work/moe-dp4-ep$ep-job.json" 4 &&
    "$bin/dhelix-plan" "$work/moe-dp4-ep$ep-job.json" -o "$work/moe-dp4-ep$ep.json" >/dev/null &&
    run 4 --plan "$work/moe-dp4-ep$ep.json" --steps 3 --loss-log "$work/moe-dp4-ep$ep.log" ||
    fail "moe: 3 steps with dp 4, ep $ep"
done
python3 - "$work/moe-dp4-ep1.log" "$work/moe-dp4-ep2.log" <<'PY' || fail "moe: DP 4 x EP 2 differs from DP 4 x EP 1"
import json, sys
ep1, ep2 = ([json.loads(line)["loss"] for line in open(name)] for name in sys.argv[1:])
print(f"dp 4: ep 1 {ep1}, ep 2 {ep2}")
sys.exit(0 if len(ep1) == len(ep2) == 3 and all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(ep1, ep2)) else 1)
PY
# A shared expert (Qwen2-MoE, with its sigmoid gate; width 64): --verify under jitter with
# EP 2, and EP 2 equals EP 1 over 3 steps.
for ep in 1 2; do
  moe_job "$ep" 1.0 "$work/moe-shared-ep$ep-job.json" 2 64 &&
    "$bin/dhelix-plan" "$work/moe-shared-ep$ep-job.json" -o "$work/moe-shared-ep$ep.json" >/dev/null &&
    run 2 --plan "$work/moe-shared-ep$ep.json" --steps 3 --loss-log "$work/moe-shared-ep$ep.log" ||
    fail "moe: 3 steps with a shared expert, ep $ep"
done
if ! run 2 --plan "$work/moe-shared-ep2.json" --steps 2 --verify --jitter-us 200 ||
  [[ $(grep -c "bitwise equal on 2 ranks" "$work/out") != 2 ]]; then
  fail "moe with a shared expert: --verify"
  cat "$work/out"
fi
python3 - "$work/moe-shared-ep1.log" "$work/moe-shared-ep2.log" <<'PY' || fail "moe: shared expert, EP 2 differs from EP 1"
import json, sys
ep1, ep2 = ([json.loads(line)["loss"] for line in open(name)] for name in sys.argv[1:])
print(f"shared expert: ep 1 {ep1}, ep 2 {ep2}")
sys.exit(0 if len(ep1) == len(ep2) == 3 and all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(ep1, ep2)) else 1)
PY

# 7. Bad input: clear errors, non-zero status, no checkpoint written.
expect_failure 2 "the plan was made for another job than" --plan "$plans/tiny-tp2.json" \
  --job "$src/examples/jobs/tiny-dp2-tp2.json" --steps 1 --checkpoint-dir "$work/bad"
expect_failure 2 "the plan needs 4 ranks (dp 1 x tp 2 x pp 2), mpirun started 2" \
  --plan "$tp2pp2" --steps 1 --checkpoint-dir "$work/bad"
expect_failure 2 "$work/missing.json" --plan "$work/missing.json" --steps 1 \
  --checkpoint-dir "$work/bad"
expect_failure 2 "holds no checkpoint" --plan "$plans/tiny-tp2.json" --steps 2 --resume \
  --checkpoint-dir "$work/bad"
# A plan whose stage-1 tasks were reordered (it needs layer 2's input before stage 0 sends
# it): the plan checker stops every rank before training.
python3 - "$tp2pp2" "$work/reordered.json" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
tasks = plan["stages"][1]["tasks"]
tasks[0], tasks[2] = tasks[2], tasks[0]
for i, task in enumerate(tasks):
    task["index"] = i
json.dump(plan, open(sys.argv[2], "w"))
PY
expect_failure 4 "layer 2's input for micro-batch 0 is used before it is produced" \
  --plan "$work/reordered.json" --steps 1 --checkpoint-dir "$work/bad"
[[ ! -e $work/bad || -z $(ls -A "$work/bad") ]] || fail "a failed run left files in $work/bad"

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "dhelix-run end to end: all passed"
