#!/usr/bin/env bash
# dhelix-run with the CP communication types other than the ring (cp_comm_type a2a,
# Ulysses, and a2a+p2p, runtime/model/layer_ops_ulysses.h; allgather,
# layer_ops_kv_allgather.h) under mpirun, on examples/jobs/tiny-cp2-tp2-a2a.json: a2a and
# allgather at CP 2 x TP 2 (4 ranks), a2a+p2p at CP 4 = [2, 2] x TP 2 (8 ranks), each:
#   1. --verify: the co-executed schedule and the sequential one give bitwise-equal losses
#      and gradients under random delays before every op;
#   2. 20 steps equal 20 steps of the same job's ring (cp_comm_type p2p, same cp) within
#      docs/kernels.md's CP tolerance, |x - p2p| <= 1e-5 |p2p|, and the loss falls;
#   3. 4 steps in one run == 2 steps + a resume of 2 more, bit for bit.
# With activation recompute: run_cp_comm_recompute_test.sh.
# Usage: run_cp_comm_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=${1:?usage: run_cp_comm_test.sh BIN_DIR SOURCE_DIR}
src=${2:?usage: run_cp_comm_test.sh BIN_DIR SOURCE_DIR}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
job=$src/examples/jobs/tiny-cp2-tp2-a2a.json
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
run() { # run RANKS ARGS...: dhelix-run under mpirun, output in $work/out
  local ranks=$1
  shift
  mpirun --oversubscribe -np "$ranks" "$bin/dhelix-run" --data "$src/examples/data/corpus.txt" \
    "$@" >"$work/out" 2>&1
}
for cp in 2 4; do
  "$bin/dhelix-plan" "$job" --cp "$cp" --cp-comm-type p2p -o "$work/p2p-cp$cp.json" >/dev/null ||
    fail "planning tiny-cp2-tp2-a2a with the ring at cp $cp"
  run $((2 * cp)) --plan "$work/p2p-cp$cp.json" --steps 20 --loss-log "$work/p2p-cp$cp.log" || {
    fail "20 steps of p2p at cp $cp"
    cat "$work/out"
  }
done
for case in "a2a 2" "allgather 2" "a2a+p2p 4"; do
  read -r type cp <<<"$case"
  ranks=$((2 * cp))
  plan=$work/$type.json
  flags=(--cp "$cp" --cp-comm-type "$type")
  [[ $type == a2a+p2p ]] && flags+=(--hierarchical-context-parallel-sizes 2 2)
  "$bin/dhelix-plan" "$job" "${flags[@]}" -o "$plan" >/dev/null || fail "planning $type"
  # 1. Equivalence of the schedules.
  if ! run "$ranks" --plan "$plan" --steps 2 --verify --jitter-us 200; then
    fail "$type --verify"
    cat "$work/out"
  elif [[ $(grep -c "bitwise equal on $ranks ranks" "$work/out") != 2 ]]; then
    fail "$type --verify did not report two verified steps"
    cat "$work/out"
  fi
  # 2. It trains as the ring does.
  run "$ranks" --plan "$plan" --steps 20 --loss-log "$work/$type.log" || {
    fail "20 steps of $type"
    cat "$work/out"
  }
  python3 - "$type" "$work/$type.log" "$work/p2p-cp$cp.log" <<'PY' || fail "$type's losses differ from the ring's"
import json, sys
kind = sys.argv[1]
x, p2p = ([json.loads(line)["loss"] for line in open(path)] for path in sys.argv[2:4])
worst = max(abs(a - b) / b for a, b in zip(x, p2p))
print(f"{kind}: loss {x[0]:.4f} -> {x[-1]:.4f}; largest relative difference to p2p {worst:.2g}")
sys.exit(0 if len(x) == len(p2p) == 20 and worst <= 1e-5 and x[-1] < 0.9 * x[0] else 1)
PY
  # 3. Resume: 4 steps == 2 steps + resume to 4.
  rm -rf "$work/ckpt" "$work/resumed.log" "$work/straight.log"  # --loss-log appends
  run "$ranks" --plan "$plan" --steps 4 --loss-log "$work/straight.log" ||
    fail "$type: 4 straight steps"
  run "$ranks" --plan "$plan" --steps 2 --checkpoint-dir "$work/ckpt" \
    --loss-log "$work/resumed.log" || fail "$type: 2 steps with a checkpoint"
  run "$ranks" --plan "$plan" --steps 4 --checkpoint-dir "$work/ckpt" --resume \
    --loss-log "$work/resumed.log" || fail "$type: resume to step 4"
  cmp -s "$work/straight.log" "$work/resumed.log" ||
    fail "$type: resumed losses differ from the straight run"
done
grep -q '"fwd.qkv_a2a"' "$work/a2a.json" || fail "the a2a plan has no fwd.qkv_a2a"
grep -q '"fwd.kv_allgather"' "$work/allgather.json" || fail "the allgather plan has no fwd.kv_allgather"
grep -q '"fwd.kv_sendrecv0"' "$work/a2a+p2p.json" || fail "the a2a+p2p plan has no ring"

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "dhelix-run CP communication types: all passed"
