#!/usr/bin/env bash
# Runs the same benchmark binary of two builds alternately, ROUNDS times each (default 3),
# and prints for every benchmark the median CPU time of each build and their ratio
# (NEW / OLD: below 1 is faster). CPU time, not wall time: on a machine other jobs load,
# waiting for a core is not the code's time. Alternating in one run keeps the two builds
# under the same load (caches, frequency), which a noisy machine otherwise makes
# incomparable.
# Usage: compare_builds.sh OLD_BINARY NEW_BINARY [ROUNDS] [benchmark filter]
#   e.g. tests/bench/compare_builds.sh ../base/build/tests/bench/dhelix_plan_bench \
#          build/tests/bench/dhelix_plan_bench 3
set -euo pipefail
old=${1:?usage: compare_builds.sh OLD_BINARY NEW_BINARY [ROUNDS] [FILTER]}
new=${2:?}
rounds=${3:-3}
filter=${4:-.}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for ((r = 0; r < rounds; ++r)); do
  "$old" --benchmark_filter="$filter" --benchmark_format=json >"$scratch/old.$r.json"
  "$new" --benchmark_filter="$filter" --benchmark_format=json >"$scratch/new.$r.json"
done
/usr/bin/python3 - "$scratch" "$rounds" <<'PY'
import json, statistics, sys
scratch, rounds = sys.argv[1], int(sys.argv[2])
def times(which):
    out = {}
    for r in range(rounds):
        for b in json.load(open(f"{scratch}/{which}.{r}.json"))["benchmarks"]:
            out.setdefault(b["name"], []).append((b["cpu_time"], b["time_unit"]))
    return out
old, new = times("old"), times("new")
print(f"{'benchmark (median CPU time)':48} {'old':>12} {'new':>12} {'new/old':>8}")
for name in old:
    if name not in new:
        continue
    a = statistics.median(t for t, _ in old[name])
    b = statistics.median(t for t, _ in new[name])
    unit = old[name][0][1]
    print(f"{name:48} {a:10.3f}{unit:>2} {b:10.3f}{unit:>2} {b / a:8.3f}")
PY
