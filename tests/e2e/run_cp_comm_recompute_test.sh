#!/usr/bin/env bash
# dhelix-run with activation recompute under the CP communication types other than the
# ring (a2a and allgather at CP 2 x TP 2 on 4 ranks, a2a+p2p at CP 4 = [2, 2] x TP 2 on 8),
# on examples/jobs/tiny-cp2-tp2-a2a.json. The plan repeats the core attention's CP
# collectives in the backward as Megatron's checkpoint does (lib/dag_builder_recompute.cc:
# selective repeats qkv_a2a, the attention and out_a2a, or kv_allgather and the attention;
# full the whole forward). For each type and granularity (full, selective):
#   1. the plan holds the repeated collective (bwd.recompute.qkv_a2a or .kv_allgather);
#   2. --verify: 4 steps of the co-executed and the sequential schedule give bitwise-equal
#      losses and gradients under random delays before every op;
#   3. those 4 steps' losses are the storing plan's (no recompute), bit for bit: the
#      repeated forward runs the same kernels on the same inputs.
# Usage: run_cp_comm_recompute_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=${1:?usage: run_cp_comm_recompute_test.sh BIN_DIR SOURCE_DIR}
src=${2:?usage: run_cp_comm_recompute_test.sh BIN_DIR SOURCE_DIR}
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
for case in "a2a 2 qkv_a2a" "allgather 2 kv_allgather" "a2a+p2p 4 qkv_a2a"; do
  read -r type cp repeated <<<"$case"
  ranks=$((2 * cp))
  flags=(--cp "$cp" --cp-comm-type "$type")
  [[ $type == a2a+p2p ]] && flags+=(--hierarchical-context-parallel-sizes 2 2)
  "$bin/dhelix-plan" "$job" "${flags[@]}" -o "$work/$type.json" >/dev/null ||
    fail "planning $type"
  run "$ranks" --plan "$work/$type.json" --steps 4 --loss-log "$work/$type.log" || {
    fail "4 storing steps of $type"
    cat "$work/out"
  }
  for granularity in full selective; do
    plan=$work/$type-$granularity.json
    "$bin/dhelix-plan" "$job" "${flags[@]}" --recompute-granularity "$granularity" -o "$plan" \
      >/dev/null || fail "planning $type with $granularity recompute"
    grep -q "\"bwd.recompute.$repeated\"" "$plan" ||
      fail "$type with $granularity recompute: the plan does not repeat $repeated"
    if ! run "$ranks" --plan "$plan" --steps 4 --verify --jitter-us 200 \
      --loss-log "$work/$type-$granularity.log" ||
      [[ $(grep -c "bitwise equal on $ranks ranks" "$work/out") != 4 ]]; then
      fail "$type with $granularity recompute --verify"
      cat "$work/out"
    fi
    cmp -s "$work/$type.log" "$work/$type-$granularity.log" ||
      fail "$type with $granularity recompute: losses differ from the storing plan's"
  done
done

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "dhelix-run CP communication types with recompute: all passed"
