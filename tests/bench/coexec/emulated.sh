#!/usr/bin/env bash
# Co-execution benchmark on emulated links (docs/runtime.md, "Co-execution on an emulated
# link"): for each job and link rate, in this order:
#   1. profile: mpirun dhelix-profile --backend cpu --emulate-link RATE (every collective
#      completes when a link of RATE would have finished it; runtime/comm/emulated_link.h);
#   2. plan:    dhelix-plan --profile (its predictions of both schedules);
#   3. run:     dhelix-run co-executed and --sequential on the same emulated link, STEPS
#               steps each, with --trace and --loss-log, ROUNDS times in turn (co-executed,
#               sequential, co-executed, ...): the host's speed drifts by 10-20 % from one
#               minute to the next, and a round's pair ran together;
#   4. compare: losses bit for bit, and compare.py's figures (medians over rounds: speed-up,
#               comm share, predicted against measured, achieved hiding, where the time
#               goes, calls that returned after their emulated link was done).
# RATE "none" runs the same chain on the real transport (shared memory, no emulation).
# Not a CTest test and never tuned to pass: it prints what it measured, one line per case
# (and OUT/results.jsonl), and keeps every raw file in OUT.
#
# Usage: tests/bench/coexec/emulated.sh BUILD_DIR [OUT_DIR]
#   env: JOBS="tp2-h256:2:2:5gbit@20us,1gbit@20us,500mbit@20us,none ..." (job:run ranks:
#        profile ranks[:rates]; the profile's a multiple of the largest group, as many as
#        the run's so that the host is as busy while profiling as in the run; the rates,
#        comma-separated, put communication at about 15, 30-40 and 50 % of each job's
#        sequential step; job files beside this script)
#        RATES="..." (the rates of a job that names none)   STEPS=6   ROUNDS=3
set -euo pipefail
build=$(cd "${1:?usage: emulated.sh BUILD_DIR [OUT_DIR]}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../.." && pwd)
out=${2:-$(mktemp -d)}
mkdir -p "$out"
jobs=${JOBS:-"tp2-h256:2:2:5gbit@20us,1gbit@20us,500mbit@20us,none
  cp2-h256:2:2:2gbit@20us,500mbit@20us,200mbit@20us,none
  cp2-tp2-h256:4:4:20gbit@20us,2gbit@20us,500mbit@20us,none
  ep2-h256:2:2:2gbit@20us,500mbit@20us,200mbit@20us,none"}
default_rates=${RATES:-"5gbit@20us 2gbit@20us 1gbit@20us 500mbit@20us none"}
steps=${STEPS:-6}
rounds=${ROUNDS:-3}
data=$src/examples/data/corpus.txt
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

echo "emulated-link benchmark: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)," \
  "$steps steps, $rounds rounds, $(date -u +%FT%TZ)" | tee "$out/summary.txt"
for entry in $jobs; do
  IFS=: read -r job ranks profile_ranks job_rates <<<"$entry"
  rates=${job_rates:+${job_rates//,/ }}
  for rate in ${rates:-$default_rates}; do
    d=$out/$job/${rate/@/-}
    mkdir -p "$d"
    link=()
    [[ $rate != none ]] && link=(--emulate-link "$rate")
    mpirun --oversubscribe -np "$profile_ranks" "$build/tools/dhelix-profile" --backend cpu \
      "$here/$job.json" "${link[@]}" -o "$d/profile.json" >"$d/profile.log" 2>&1 ||
      { cat "$d/profile.log"; exit 1; }
    "$build/tools/dhelix-plan" "$here/$job.json" --profile "$d/profile.json" -o "$d/plan.json" \
      >"$d/plan.log"
    losses=bitwise-equal
    for round in $(seq "$rounds"); do
      for schedule in co-executed sequential; do
        flags=()
        [[ $schedule == sequential ]] && flags=(--sequential)
        f=$d/$schedule.$round
        mpirun --oversubscribe -np "$ranks" "$build/tools/dhelix-run" --plan "$d/plan.json" \
          --data "$data" --steps "$steps" --no-progress "${link[@]}" "${flags[@]}" \
          --trace "$f.trace.json" --loss-log "$f.loss.log" >"$f.log" 2>&1 ||
          { cat "$f.log"; exit 1; }
        "$build/tools/dhelix-diff" --json "$d/plan.json" --measured "$f.trace.json" >"$f.diff.json"
      done
      cmp -s "$d/co-executed.$round.loss.log" "$d/sequential.$round.loss.log" || losses=differ
    done
    python3 "$here/compare.py" "$d" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
r.update(job=sys.argv[1], rate=sys.argv[2], losses=sys.argv[3], load=open("/proc/loadavg").read().split()[0])
open(sys.argv[4], "a").write(json.dumps(r) + "\n")
hiding = "-" if r["hiding"] is None else f"{100 * r['"'"'hiding'"'"']:.0f} %"
spread = "/".join(f"{x['"'"'speedup'"'"']:.2f}" for x in r["rounds"])
print(f"{r['"'"'job'"'"']:<13} {r['"'"'rate'"'"']:<11} comm {100 * r['"'"'comm_share'"'"']:3.0f} %  co {r['"'"'co_ms'"'"']:8.1f} ms  "
      f"seq {r['"'"'seq_ms'"'"']:8.1f} ms  speed-up {r['"'"'speedup'"'"']:.2f}x ({spread}; plan {r['"'"'pred_gain'"'"']:.2f}x)  "
      f"error co {r['"'"'err_co_pct'"'"']:+.1f} % seq {r['"'"'err_seq_pct'"'"']:+.1f} %  hidden {r['"'"'hidden_ms'"'"']:.1f} of "
      f"{r['"'"'plan_hidden_ms'"'"']:.1f} ms ({hiding})  losses {r['"'"'losses'"'"']}")
' "$job" "$rate" "$losses" "$out/results.jsonl" | tee -a "$out/summary.txt"
  done
done
echo "raw files: $out"
