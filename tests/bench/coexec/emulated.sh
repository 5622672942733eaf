#!/usr/bin/env bash
# Co-execution benchmark on emulated links (docs/runtime.md, "Co-execution on an emulated
# link"): for each job and link rate, in this order:
#   1. profile: mpirun dhelix-profile --backend cpu --emulate-link RATE (every collective
#      completes when a link of RATE would have finished it; runtime/comm/emulated_link.h);
#   2. plan:    dhelix-plan --profile (its predictions of both schedules);
#   3. run:     dhelix-run co-executed and --sequential on the same emulated link, STEPS
#               steps each, with --trace and --loss-log;
#   4. compare: losses bit for bit, and compare.py's figures (speed-up, comm share,
#               predicted against measured, achieved hiding, where the time goes).
# RATE "none" runs the same chain on the real transport (shared memory, no emulation).
# Not a CTest test and never tuned to pass: it prints what it measured, one line per case
# (and OUT/results.jsonl), and keeps every raw file in OUT.
#
# Usage: tests/bench/coexec/emulated.sh BUILD_DIR [OUT_DIR]
#   env: JOBS="tp2-h256:2:2 cp2-tp2-h256:4:4 ep2-h256:2:2" (job:run ranks:profile ranks; the
#        profile's a multiple of the largest group, as many as the run's so that the host
#        is as busy while profiling as in the run; job files beside this script)
#        RATES="5gbit@20us 2gbit@20us 1gbit@20us 500mbit@20us none"   STEPS=6
set -euo pipefail
build=$(cd "${1:?usage: emulated.sh BUILD_DIR [OUT_DIR]}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../.." && pwd)
out=${2:-$(mktemp -d)}
mkdir -p "$out"
jobs=${JOBS:-"tp2-h256:2:2 cp2-tp2-h256:4:4 ep2-h256:2:2"}
rates=${RATES:-"5gbit@20us 2gbit@20us 1gbit@20us 500mbit@20us none"}
steps=${STEPS:-6}
data=$src/examples/data/corpus.txt
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

echo "emulated-link benchmark: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)," \
  "$steps steps, $(date -u +%FT%TZ)" | tee "$out/summary.txt"
for entry in $jobs; do
  IFS=: read -r job ranks profile_ranks <<<"$entry"
  for rate in $rates; do
    d=$out/$job/${rate/@/-}
    mkdir -p "$d"
    link=()
    [[ $rate != none ]] && link=(--emulate-link "$rate")
    mpirun --oversubscribe -np "$profile_ranks" "$build/tools/dhelix-profile" --backend cpu \
      "$here/$job.json" "${link[@]}" -o "$d/profile.json" >"$d/profile.log" 2>&1 ||
      { cat "$d/profile.log"; exit 1; }
    "$build/tools/dhelix-plan" "$here/$job.json" --profile "$d/profile.json" -o "$d/plan.json" \
      >"$d/plan.log"
    for schedule in co-executed sequential; do
      flags=()
      [[ $schedule == sequential ]] && flags=(--sequential)
      mpirun --oversubscribe -np "$ranks" "$build/tools/dhelix-run" --plan "$d/plan.json" \
        --data "$data" --steps "$steps" --no-progress "${link[@]}" "${flags[@]}" \
        --trace "$d/$schedule.trace.json" --loss-log "$d/$schedule.loss.log" \
        >"$d/$schedule.log" 2>&1 || { cat "$d/$schedule.log"; exit 1; }
      "$build/tools/dhelix-diff" --json "$d/plan.json" --measured "$d/$schedule.trace.json" \
        >"$d/$schedule.diff.json"
    done
    losses=differ
    cmp -s "$d/co-executed.loss.log" "$d/sequential.loss.log" && losses=bitwise-equal
    python3 "$here/compare.py" "$d" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
r.update(job=sys.argv[1], rate=sys.argv[2], losses=sys.argv[3], load=open("/proc/loadavg").read().split()[0])
open(sys.argv[4], "a").write(json.dumps(r) + "\n")
hiding = "-" if r["hiding"] is None else f"{100 * r['"'"'hiding'"'"']:.0f} %"
print(f"{r['"'"'job'"'"']:<13} {r['"'"'rate'"'"']:<11} comm {100 * r['"'"'comm_share'"'"']:3.0f} %  co {r['"'"'co_ms'"'"']:8.1f} ms  "
      f"seq {r['"'"'seq_ms'"'"']:8.1f} ms  speed-up {r['"'"'speedup'"'"']:.2f}x (plan {r['"'"'pred_gain'"'"']:.2f}x)  "
      f"error co {r['"'"'err_co_pct'"'"']:+.1f} % seq {r['"'"'err_seq_pct'"'"']:+.1f} %  hidden {r['"'"'hidden_ms'"'"']:.1f} of "
      f"{r['"'"'plan_hidden_ms'"'"']:.1f} ms ({hiding})  losses {r['"'"'losses'"'"']}")
' "$job" "$rate" "$losses" "$out/results.jsonl" | tee -a "$out/summary.txt"
  done
done
echo "raw files: $out"
