#!/usr/bin/env bash
# What each CPU-backend setting changes (docs/runtime.md, "Settings of the CPU backend"):
# the co-executed and the sequential schedule of the benchmark job under --comm-wait spin,
# --comm-wait backoff (longest sleep 50 us, and 20 and 100), backoff with --pin-compute, backoff with --trace (its overhead), spin
# with OpenMPI's mpi_yield_when_idle, and backoff with OpenMPI's TCP progress thread
# (btl_tcp_progress_thread), with 4 MiB socket buffers (btl_tcp_sndbuf, btl_tcp_rcvbuf: the
# kernel drains a whole message without waiting for the sender's next MPI call) and with a
# 256 KiB eager limit (no rendezvous hand-shake for the benchmark's 128 KiB messages), run
# round-robin ROUNDS times so that a change in the machine's
# load hits every setting alike. Prints, per setting, the median step time (steps 2.., every round) and the median
# CPU time (user + sys of both ranks) per run.
#
# Usage: tests/bench/coexec/settings.sh BUILD_DIR PLAN [RATE] (env: ROUNDS=3 STEPS=5,
# ONLY=name|name...: those settings only)
# RATE: a scripts/shaped-link.sh rate (default 1gbit; none: the same TCP links unshaped).
set -euo pipefail
build=$(cd "${1:?usage: settings.sh BUILD_DIR PLAN [RATE]}" && pwd)
plan=${2:?usage: settings.sh BUILD_DIR PLAN [RATE]}
rate=${3:-1gbit}
rounds=${ROUNDS:-3}
steps=${STEPS:-5}
src=$(cd "$(dirname "$0")/../../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# name|environment (OpenMPI's MCA settings, read by mpirun)|dhelix-run flags
settings=("spin||--comm-wait spin" "backoff||--comm-wait backoff" "backoff+pin||--pin-compute"
  "backoff-sleep20||--comm-max-sleep-us 20" "backoff-sleep100||--comm-max-sleep-us 100"
  "backoff+trace||--trace $work/t.json"
  "spin+yield|OMPI_MCA_mpi_yield_when_idle=1|--comm-wait spin"
  "backoff+tcpthread|OMPI_MCA_btl_tcp_progress_thread=1|--comm-wait backoff"
  "backoff+tcpbuf|OMPI_MCA_btl_tcp_sndbuf=4194304 OMPI_MCA_btl_tcp_rcvbuf=4194304|--comm-wait backoff"
  "backoff+eager|OMPI_MCA_btl_tcp_eager_limit=262144 OMPI_MCA_btl_tcp_max_send_size=262144|--comm-wait backoff")
[[ -n ${ONLY:-} ]] && { mapfile -t settings < <(printf '%s\n' "${settings[@]}" | grep -E "^(${ONLY})\|"); }
echo "settings: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), rate $rate," \
  "$rounds rounds of $steps steps"
for round in $(seq "$rounds"); do
  for schedule in co-executed sequential; do
    flags=()
    [[ $schedule == sequential ]] && flags=(--sequential)
    for entry in "${settings[@]}"; do
      IFS='|' read -r name environment options <<<"$entry"
      read -r -a extra <<<"$options"
      read -r -a environment <<<"$environment"
      /usr/bin/time -f "%U %S" -o "$work/time" env "${environment[@]}" \
        "$src/scripts/shaped-link.sh" --rate "$rate" \
        -np 2 -- "$build/tools/dhelix-run" --plan "$plan" --data "$src/examples/data/corpus.txt" \
        --steps "$steps" "${flags[@]}" "${extra[@]}" >"$work/out" 2>&1
      sed -n 's/^step *\([0-9]*\)\/.* \([0-9.]*\) s .*/\1 \2/p' "$work/out" |
        awk -v key="$schedule $name" '$1 > 1 { print key, "step", $2 }' >>"$work/results"
      echo "$schedule $name cpu $(awk '{ print $1 + $2 }' "$work/time")" >>"$work/results"
    done
  done
done
python3 - "$work/results" <<'PY'
import collections, statistics, sys
steps, cpu = collections.defaultdict(list), collections.defaultdict(list)
for line in open(sys.argv[1]):
    schedule, name, what, value = line.split()
    (steps if what == "step" else cpu)[(schedule, name)].append(float(value))
print(f"{'schedule':<12} {'setting':<17} {'median step s':>13} {'steps':>5} {'median cpu s':>12}")
for key in steps:
    print(f"{key[0]:<12} {key[1]:<17} {statistics.median(steps[key]):>13.3f} "
          f"{len(steps[key]):>5} {statistics.median(cpu[key]):>12.2f}")
PY
