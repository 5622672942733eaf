#!/usr/bin/env bash
# The measured-memory table of docs/runtime.md ("Activation memory"): each shipped tiny
# plan (and PLAN files given) trains one step under mpirun with --trace, and dhelix-diff
# --measured compares rank 0's activation figures with its stage's prediction. Prints one
# markdown row per plan: plan, the plan's prediction, the plan's count measured (error),
# the live peak, the arena, the arena over the prediction. MiB = 2^20 bytes.
#
#   scripts/memory-table.sh [BUILD_DIR] [PLAN...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plans=("$@")
if [ ${#plans[@]} -eq 0 ]; then
  for name in tiny-tp2 tiny-tp2-pp2 tiny-cp2-tp2 tiny-dp2-tp2 tiny-tp2-recompute tiny-moe-ep2 \
    tiny-moe-ep2-tp2; do
    plans+=("examples/plans/$name.json")
  done
fi
echo "| plan | predicted MiB | the plan's count MiB | error | live peak MiB | arena MiB | arena / predicted |"
echo "|---|---|---|---|---|---|---|"
for plan in "${plans[@]}"; do
  name=$(basename "$plan" .json)
  ranks=$(python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['job']['parallel']; \
print(p['dp']*p['tp']*p.get('pp',1)*p.get('cp',1))" "$plan")
  mpirun -np "$ranks" "$build/tools/dhelix-run" --plan "$plan" --data examples/data/corpus.txt \
    --steps 1 --trace "$work/$name.trace.json" >"$work/$name.out" 2>&1 ||
    { cat "$work/$name.out"; exit 1; }
  "$build/tools/dhelix-diff" "$plan" --measured "$work/$name.trace.json" --json >"$work/$name.diff.json"
  python3 - "$work/$name.diff.json" "$name" <<'EOF'
import json, sys
rank = json.load(open(sys.argv[1]))["memory"]["ranks"][0]
terms = {t["term"]: t for t in rank["terms"]}
count, live, arena = (terms[f"activations ({k})"] for k in ("the plan's count", "live peak", "arena"))
mib = lambda b: b / 2**20
p = count["predicted_bytes"]
print(f"| {sys.argv[2]} | {mib(p):.3f} | {mib(count['measured_bytes']):.3f} | "
      f"{100 * (count['measured_bytes'] / p - 1):+.1f} % | {mib(live['measured_bytes']):.3f} | "
      f"{mib(arena['measured_bytes']):.3f} | {arena['measured_bytes'] / p:.2f} |")
EOF
done
