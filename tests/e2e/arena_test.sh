#!/usr/bin/env bash
# The activation arena end to end (docs/runtime.md, "Activation memory"), on shipped tiny
# plans under mpirun:
#   1. every activation in the arena gives the bits of one allocation per buffer
#      (DHELIX_ACTIVATION_ARENA=separate): the same loss log, bit for bit, over 4 steps,
#      co-executed under --verify with jitter (a buffer whose lifetime is too short is
#      overwritten by the buffer that shares its bytes, or reads the arena's NaN fill);
#   2. each rank's memory line: an arena above zero, at least the live peak, at least the
#      plan's count;
#   3. the plan's count against the plan's stage prediction (dhelix-diff --measured): within
#      2 % (TP, PP, CP, DP, full and selective recompute, MoE with EP, MoE with EP and TP);
#      on MoE the model states' parameter counts match the plan's (dhelix-diff passes);
#   4. full recompute lowers the plan's count by the factor the plan predicts, within 5 %;
#   5. an unknown DHELIX_ACTIVATION_ARENA value is refused by name.
# Usage: arena_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=${1:?usage: arena_test.sh BIN_DIR SOURCE_DIR}
src=${2:?usage: arena_test.sh BIN_DIR SOURCE_DIR}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
corpus=$src/examples/data/corpus.txt
plans=$src/examples/plans

ranks_of() {
  python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['job']['parallel']; \
print(p['dp']*p['tp']*p.get('pp',1)*p.get('cp',1))" "$1"
}

run() {  # run PLAN OUT [extra args...]
  local plan=$1 out=$2
  shift 2
  mpirun -np "$(ranks_of "$plan")" "$bin/dhelix-run" --plan "$plan" --data "$corpus" "$@" \
    >"$out" 2>&1 || { cat "$out"; echo "FAIL: dhelix-run $plan $*"; exit 1; }
}

# The plan's count of rank 0 (MiB) from its memory line.
counted_mib() {
  sed -n 's/^memory rank 0 .*of which the plan counts \([0-9.]*\) MiB.*/\1/p' "$1"
}

# Selective recompute: the storing plan with --recompute-granularity selective.
"$bin/dhelix-plan" "$src/examples/jobs/tiny-tp2.json" --recompute-granularity selective \
  -o "$work/tiny-tp2-selective.json" >/dev/null
selective=$work/tiny-tp2-selective.json

for plan in "$plans"/tiny-tp2-pp2.json "$plans"/tiny-cp2-tp2.json "$plans"/tiny-tp2-recompute.json \
  "$plans"/tiny-dp2-tp2.json "$plans"/tiny-moe-ep2.json "$plans"/tiny-moe-ep2-tp2.json \
  "$selective"; do
  name=$(basename "$plan" .json)
  # 1. arena == separate, bit for bit, under --verify with jitter.
  run "$plan" "$work/$name.arena.out" --steps 4 --verify --jitter-us 100 \
    --loss-log "$work/$name.arena.log"
  run "$plan" "$work/$name.trace.out" --steps 1 --trace "$work/$name.trace.json"
  DHELIX_ACTIVATION_ARENA=separate run "$plan" "$work/$name.separate.out" --steps 4 \
    --loss-log "$work/$name.separate.log"
  cmp "$work/$name.arena.log" "$work/$name.separate.log" ||
    { echo "FAIL: $name: the arena changed the losses"; exit 1; }
  # 2. the memory lines.
  python3 - "$work/$name.arena.out" "$name" <<'EOF'
import re, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("memory rank")]
assert lines, f"{sys.argv[2]}: no memory line"
for l in lines:
    m = re.search(r"activations ([0-9.]+) MiB peak \(live peak ([0-9.]+) MiB, of which the plan "
                  r"counts ([0-9.]+) MiB\)", l)
    assert m, l
    arena, live, counted = map(float, m.groups())
    assert arena > 0 and arena >= live >= counted > 0, f"{sys.argv[2]}: {l}"
EOF
done
echo "ok: the arena gives the separate buffers' losses bit for bit; memory lines consistent"

# 3. the plan's count against the plan, per rank, from dhelix-diff --measured --json.
for plan in "$plans"/tiny-tp2-pp2.json "$plans"/tiny-cp2-tp2.json "$plans"/tiny-tp2-recompute.json \
  "$plans"/tiny-dp2-tp2.json "$plans"/tiny-moe-ep2.json "$plans"/tiny-moe-ep2-tp2.json "$selective"; do
  name=$(basename "$plan" .json)
  "$bin/dhelix-diff" "$plan" --measured "$work/$name.trace.json" --json >"$work/$name.diff.json"
  python3 - "$work/$name.diff.json" "$name" <<'EOF'
import json, sys
diff = json.load(open(sys.argv[1]))
for rank in diff["memory"]["ranks"]:
    row = next(t for t in rank["terms"] if t["term"] == "activations (the plan's count)")
    error = abs(row["measured_bytes"] - row["predicted_bytes"]) / row["predicted_bytes"]
    assert error <= 0.02, f"{sys.argv[2]} rank {rank['rank']}: {row} ({100 * error:.1f} %)"
EOF
done
echo "ok: the plan's count within 2 % of the plan's activation prediction on every rank"
# MoE: the model states' parameter counts match the plan's (the experts' optimizer states
# split over the expert-data-parallel group, the rest over DP x CP), so dhelix-diff passes.
for name in tiny-moe-ep2 tiny-moe-ep2-tp2; do
  "$bin/dhelix-diff" "$plans/$name.json" --measured "$work/$name.trace.json" >"$work/$name.diff.txt" ||
    { cat "$work/$name.diff.txt"; echo "FAIL: dhelix-diff --measured on $name"; exit 1; }
done
echo "ok: MoE model states match the plan's parameter counts"

# 4. recompute's factor: measured counts against the plans' predictions.
python3 - "$work" "$plans" <<'EOF'
import json, re, sys
work, plans = sys.argv[1], sys.argv[2]
def measured(name):
    text = open(f"{work}/{name}.arena.out").read()
    return float(re.search(r"memory rank 0 .*of which the plan counts ([0-9.]+) MiB", text).group(1))
def predicted(name):
    plan = json.load(open(f"{plans}/{name}.json"))
    scheme = next(s for s in plan["schemes"] if s["scheme"] == "dhelix")
    return scheme["memory"][0]["activation_bytes"]
m = measured("tiny-tp2-recompute") / measured("tiny-dp2-tp2")
p = predicted("tiny-tp2-recompute") / predicted("tiny-dp2-tp2")
assert abs(m / p - 1) <= 0.05, f"recompute lowers the count {m:.3f}x, the plan says {p:.3f}x"
print(f"ok: full recompute keeps {m:.3f} of the activations, the plan predicts {p:.3f}")
EOF

# 5. a bad setting.
if DHELIX_ACTIVATION_ARENA=none mpirun -np 2 "$bin/dhelix-run" --plan "$plans/tiny-tp2.json" \
  --data "$corpus" --steps 1 >"$work/bad.out" 2>&1; then
  echo "FAIL: DHELIX_ACTIVATION_ARENA=none accepted"
  exit 1
fi
grep -q 'DHELIX_ACTIVATION_ARENA=none: must be "arena"' "$work/bad.out" ||
  { cat "$work/bad.out"; echo "FAIL: no clear error for DHELIX_ACTIVATION_ARENA=none"; exit 1; }
echo "ok: arena_test"
