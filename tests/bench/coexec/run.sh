#!/usr/bin/env bash
# Co-execution benchmark on CPU ranks (docs/runtime.md, "Measured numbers on a CPU host"):
# a comm-heavy tiny Llama (tp2-h256.json: TP 2 on 2 ranks, hidden 256), in this order, once
# with the ranks' link shaped to RATE and once unshaped (the same TCP loopback without tc):
#   1. profile: mpirun -np 2 dhelix-profile --backend cpu under that link;
#   2. plan:    dhelix-plan --profile (the plan's dhelix iteration is the prediction);
#   3. run:     dhelix-run co-executed and --sequential, STEPS steps each, with --trace and
#               --loss-log;
#   4. compare: the losses bit for bit; the measured speed-up of co-execution (median
#               over steps of the slower rank's execution of the program, sequential over
#               co-executed; gradient sums and optimizer, alike in both, left out); the
#               share of communication in a sequential step (collectives' time over the
#               iteration, median over steps); predicted against measured iteration time of
#               both schedules (dhelix-diff PLAN --measured TRACE); and where the time
#               goes (rank 0, median over steps of the sums of compute ops, collectives and
#               the compute thread's waits).
# Not a CTest test, and never tuned to pass: it prints what it measured and keeps every raw
# file in OUT_DIR. Needs root for the shaped link (scripts/shaped-link.sh); without it the
# shaped half is skipped.
#
# Usage: tests/bench/coexec/run.sh BUILD_DIR [OUT_DIR] (env: RATE=1gbit STEPS=8 DELAY=)
set -euo pipefail
build=$(cd "${1:?usage: run.sh BUILD_DIR [OUT_DIR]}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../.." && pwd)
out=${2:-$(mktemp -d)}
mkdir -p "$out"
rate=${RATE:-1gbit}
steps=${STEPS:-8}
delay=${DELAY:-}
job=$here/tp2-h256.json
data=$src/examples/data/corpus.txt
link() { # link RATE CMD...: run CMD on 2 ranks over the loopback shaped to RATE (none: unshaped)
  local r=$1
  shift
  local extra=()
  [[ -n $delay && $r != none ]] && extra=(--delay "$delay")
  "$src/scripts/shaped-link.sh" --rate "$r" "${extra[@]}" -np 2 -- "$@"
}

summary=$out/summary.txt
: >"$summary"
echo "co-execution benchmark: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)," \
  "rate $rate${delay:+, delay $delay}, $steps steps" | tee -a "$summary"

for r in "$rate" none; do
  tag=${r/none/unshaped}
  d=$out/$tag
  mkdir -p "$d"
  echo "== link: $tag" | tee -a "$summary"
  # 1-2. Profile under this link, plan from that profile.
  status=0
  link "$r" "$build/tools/dhelix-profile" --backend cpu "$job" -o "$d/profile.json" \
    >"$d/profile.log" 2>&1 || status=$?
  if [[ $status == 77 ]]; then
    grep skipped "$d/profile.log" | tee -a "$summary"
    continue
  fi
  [[ $status == 0 ]] || { cat "$d/profile.log"; exit 1; }
  "$build/tools/dhelix-plan" "$job" --profile "$d/profile.json" -o "$d/plan.json" >"$d/plan.log"
  # 3. Both schedules, each traced.
  for schedule in co-executed sequential; do
    flags=()
    [[ $schedule == sequential ]] && flags=(--sequential)
    link "$r" "$build/tools/dhelix-run" --plan "$d/plan.json" --data "$data" --steps "$steps" \
      --trace "$d/$schedule.trace.json" --loss-log "$d/$schedule.loss.log" "${flags[@]}" \
      >"$d/$schedule.log" 2>&1 || { cat "$d/$schedule.log"; exit 1; }
    "$build/tools/dhelix-diff" --json "$d/plan.json" --measured "$d/$schedule.trace.json" \
      >"$d/$schedule.diff.json"
    "$build/tools/dhelix-diff" "$d/plan.json" --measured "$d/$schedule.trace.json" \
      >"$d/$schedule.diff.txt"
  done
  # 4. Compare.
  if cmp -s "$d/co-executed.loss.log" "$d/sequential.loss.log"; then
    echo "losses: bitwise equal over $steps steps" | tee -a "$summary"
  else
    echo "losses: DIFFER (see $d/*.loss.log)" | tee -a "$summary"
  fi
  python3 - "$d" <<'PY' | tee -a "$summary"
import json, statistics, sys
d = sys.argv[1]
def diff(schedule):
    return json.load(open(f"{d}/{schedule}.diff.json"))["iteration"]
def comm_share(schedule):
    trace = json.load(open(f"{d}/{schedule}.trace.json"))
    comm, iteration = {}, {}
    for e in trace["traceEvents"]:
        if e.get("ph") != "X":
            continue
        key = (e["pid"], e["args"].get("step"))
        if e["name"] == "iteration":
            iteration[key] = e["dur"]
        elif e["args"].get("kind") == "collective":
            comm[key] = comm.get(key, 0) + e["dur"]
    return statistics.median(comm.get(k, 0) / v for k, v in iteration.items())
def execution(schedule):
    """Median over steps of the slowest rank's execution of the program ("iteration")."""
    trace = json.load(open(f"{d}/{schedule}.trace.json"))
    steps = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e["name"] == "iteration":
            step = e["args"]["step"]
            steps[step] = max(steps.get(step, 0), e["dur"])
    return statistics.median(steps.values())
co, seq = diff("co-executed"), diff("sequential")
print(f"sequential step: communication {100 * comm_share('sequential'):.0f} % of the iteration")
co_us, seq_us = execution("co-executed"), execution("sequential")
print(f"measured execution of the program: co-executed {co_us / 1e3:.2f} ms, sequential "
      f"{seq_us / 1e3:.2f} ms: speed-up {seq_us / co_us:.2f}x")
for name, row in (("co-executed", co), ("sequential", seq)):
    print(f"{name}: predicted {row['predicted_us'] / 1e3:.2f} ms, measured "
          f"{row['measured_us'] / 1e3:.2f} ms, error {row['error_pct']:+.1f} %")
def where_the_time_goes(schedule):
    """Rank 0, median over steps: compute ops, collectives, compute thread waiting, iteration."""
    trace = json.load(open(f"{d}/{schedule}.trace.json"))
    threads = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
               if e.get("ph") == "M" and e["name"] == "thread_name" and e["pid"] == 0}
    sums = {}
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e["pid"] != 0 or "step" not in e["args"]:
            continue
        row = sums.setdefault(e["args"]["step"], [0.0, 0.0, 0.0, 0.0])
        kind = e["args"].get("kind")
        if kind == "compute":
            row[0] += e["dur"]
        elif kind == "collective":
            row[1] += e["dur"]
        elif e["name"] == "wait" and threads.get(e["tid"]) == "compute":
            row[2] += e["dur"]
        elif e["name"] == "iteration":
            row[3] += e["dur"]
    return [statistics.median(r[i] for r in sums.values()) / 1e3 for i in range(4)]
for name in ("sequential", "co-executed"):
    compute, collectives, waiting, iteration = where_the_time_goes(name)
    print(f"{name} (rank 0, ms per step): compute ops {compute:.1f}, collectives "
          f"{collectives:.1f}, compute thread waiting {waiting:.1f}, iteration {iteration:.1f}")
plan = json.load(open(f"{d}/plan.json"))
schemes = {s["scheme"]: s["iteration_us"] for s in plan["schemes"]}
print(f"plan: dhelix {schemes['dhelix'] / 1e3:.2f} ms (with the optimizer step); predicted "
      f"gain over the sequential prediction (ops only) {seq['predicted_us'] / co['predicted_us']:.2f}x")
PY
done
echo "raw files: $out"
