#!/usr/bin/env bash
# Compares the planner's speed of two builds in one run, on the same machine and load:
#   scripts/compare-planner-builds.sh BASE_BUILD NEW_BUILD [OUT_DIR] [REPEATS]
# e.g. a build of the commit before a change in a second worktree against this one:
#   git worktree add --detach ../dhelix-base <commit> && (cd ../dhelix-base && scripts/build.sh)
#   scripts/compare-planner-builds.sh ../dhelix-base/build build /tmp/planner-speed
#
# 1. The pairing benchmarks (tests/bench, Google Benchmark) of both builds, JSON output
#    kept in OUT_DIR/{base,new}-bench.json; benchmarks only the new build has are shown
#    without a base figure.
# 2. dhelix-plan on every examples/jobs/*.json and on the Llama-66B CP8 64k variant, CPU
#    time (user + sys) and peak memory, median of REPEATS runs (default 3), the two builds
#    alternating; and whether the two plans are identical once `meta` (version, git hash,
#    argv) is set aside.
# Prints one markdown table per part (CPU times in seconds; ratio = base / new).
set -euo pipefail
base=$(cd "${1:?usage: compare-planner-builds.sh BASE_BUILD NEW_BUILD [OUT_DIR] [REPEATS]}" && pwd)
new=$(cd "${2:?usage: compare-planner-builds.sh BASE_BUILD NEW_BUILD [OUT_DIR] [REPEATS]}" && pwd)
out=${3:-$(mktemp -d)}
repeats=${4:-3}
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
export DHELIX_DETERMINISTIC=1

# ----- 1. benchmarks ----------------------------------------------------------------------
for which in base new; do
  dir=$base
  [ "$which" = new ] && dir=$new
  "$dir/tests/bench/dhelix_pairing_bench" --benchmark_filter='DownsetDp|RealLayer|Window' \
    --benchmark_repetitions="$repeats" --benchmark_report_aggregates_only=true \
    --benchmark_format=json --benchmark_out="$out/$which-bench.json" >/dev/null 2>&1
done

# ----- 2. dhelix-plan end to end ----------------------------------------------------------
cases=()
for job in "$src"/examples/jobs/*.json; do cases+=("$(basename "$job" .json)|$job"); done
cases+=("llama-66b-cp8-seq64k|$src/examples/jobs/llama-66b-a800-dp1-tp8-cp4-pp2-seq32k.json --cp 8 --seq 65536")
: >"$out/plan-times.txt"
for entry in "${cases[@]}"; do
  name=${entry%%|*}
  args=${entry#*|}
  for ((r = 0; r < repeats; ++r)); do
    for which in base new; do
      dir=$base
      [ "$which" = new ] && dir=$new
      # shellcheck disable=SC2086  # args holds the job file and its flags
      /usr/bin/time -f "%U %S %M" -o "$out/time.txt" "$dir/tools/dhelix-plan" $args \
        -o "$out/$name.$which.plan.json" >/dev/null 2>&1 || true
      echo "$name $which $(cat "$out/time.txt")" >>"$out/plan-times.txt"
    done
  done
done

python3 - "$out" <<'EOF'
import json, statistics, sys
out = sys.argv[1]

def bench(which):
    with open(f"{out}/{which}-bench.json") as f:
        rows = json.load(f)["benchmarks"]
    return {r["run_name"]: r for r in rows if r.get("aggregate_name") == "median"}

base, new = bench("base"), bench("new")
print("| benchmark (median CPU ms) | base | new | base / new |")
print("|---|---:|---:|---:|")
for name, r in new.items():
    b = base.get(name)
    ratio = f"{b['cpu_time'] / r['cpu_time']:.1f}x" if b else "-"
    bt = f"{b['cpu_time']:.1f}" if b else "-"
    print(f"| {name} | {bt} | {r['cpu_time']:.1f} | {ratio} |")

times = {}
for line in open(f"{out}/plan-times.txt"):
    name, which, user, system, rss = line.split()
    times.setdefault((name, which), []).append((float(user) + float(system), int(rss)))

def same_plan(name):
    plans = []
    for which in ("base", "new"):
        try:
            with open(f"{out}/{name}.{which}.plan.json") as f:
                plan = json.load(f)
        except (OSError, ValueError):
            return "no plan"
        plan.pop("meta", None)
        plans.append(plan)
    return "yes" if plans[0] == plans[1] else "DIFFERS"

print()
print("| dhelix-plan (median CPU s, peak MB) | base | new | base / new | same plan |")
print("|---|---:|---:|---:|---|")
for name in dict.fromkeys(n for n, _ in times):
    b = statistics.median(t for t, _ in times[(name, "base")])
    n = statistics.median(t for t, _ in times[(name, "new")])
    bm = max(m for _, m in times[(name, "base")]) // 1024
    nm = max(m for _, m in times[(name, "new")]) // 1024
    print(f"| {name} | {b:.2f} ({bm} MB) | {n:.2f} ({nm} MB) | {b / n:.1f}x | {same_plan(name)} |")
EOF
