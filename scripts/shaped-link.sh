#!/usr/bin/env bash
# Runs an MPI job on this host with the link between its ranks shaped to a rate (and a
# delay): the job gets a network namespace of its own (unshare -n) whose only interface is
# a loopback, tc shapes that loopback, and OpenMPI is told to move every message over TCP
# on it (--mca btl tcp,self: no shared-memory shortcut). Used by tests and benchmarks to
# give CPU ranks a link that costs wire time, not cores (docs/runtime.md).
#
#   scripts/shaped-link.sh [--rate RATE] [--delay DELAY] [--burst SIZE] [--stats] -np N -- CMD ARGS...
#
#   --rate RATE    tc rate: 1gbit, 500mbit, ... (default 1gbit); "none" leaves the link unshaped
#   --delay DELAY  one-way delay added by netem (e.g. 100us; default none): needs the kernel's
#                  sch_netem, and says so when it is missing
#   --burst SIZE   tbf bucket (default 256kb): at least the loopback's 64 KiB packets
#   --stats        print the loopback's qdisc counters after the job (bytes that were shaped)
#   -np N          ranks (mpirun -np)
#
# Needs root (a network namespace and tc). Without it, or without unshare, ip or tc
# (Debian: util-linux, iproute2), it prints why and exits 77, the status the tests read as
# "skipped". Only the new namespace's own loopback is touched: the namespace, and every tc
# rule in it, disappears when the job ends, however it ends.
set -euo pipefail

skip() {
  echo "shaped-link: skipped: $*" >&2
  exit 77
}
usage() {
  echo "usage: shaped-link.sh [--rate RATE] [--delay DELAY] [--burst SIZE] [--stats] -np N -- CMD ARGS..." >&2
  exit 2
}

rate=1gbit delay="" burst=256kb stats=0 ranks="" inside=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rate) rate=${2:?}; shift 2 ;;
    --delay) delay=${2:?}; shift 2 ;;
    --burst) burst=${2:?}; shift 2 ;;
    --stats) stats=1; shift ;;
    -np) ranks=${2:?}; shift 2 ;;
    --inside) inside=1; shift ;;  # internal: already in the new namespace
    --) shift; break ;;
    *) usage ;;
  esac
done
[[ $# -gt 0 && $ranks =~ ^[1-9][0-9]*$ ]] || usage

if [[ $inside == 0 ]]; then
  [[ $(id -u) == 0 ]] || skip "needs root for a network namespace and tc (running as uid $(id -u))"
  for program in unshare ip tc mpirun; do
    command -v "$program" >/dev/null 2>&1 ||
      skip "$program not found (Debian: util-linux, iproute2, openmpi-bin; scripts/install-deps.sh)"
  done
  args=(--rate "$rate" --burst "$burst" -np "$ranks")
  [[ -n $delay ]] && args+=(--delay "$delay")
  [[ $stats == 1 ]] && args+=(--stats)
  # The namespace lives as long as this one process: nothing to clean up after it.
  exec unshare --net -- "$0" --inside "${args[@]}" -- "$@"
fi

# In the new namespace: bring its loopback up and shape it.
ip link set lo up
parent=(root)
if [[ -n $delay ]]; then
  tc qdisc add dev lo root handle 1: netem delay "$delay" 2>/dev/null ||
    skip "tc netem is not available in this kernel (module sch_netem), so --delay cannot work"
  parent=(parent 1:1)
fi
if [[ $rate != none ]]; then
  tc qdisc add dev lo "${parent[@]}" handle 10: tbf rate "$rate" burst "$burst" latency 100ms
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0
mpirun --oversubscribe -np "$ranks" --mca btl tcp,self --mca btl_tcp_if_include lo \
  --mca oob_tcp_if_include lo "$@" || status=$?
if [[ $stats == 1 ]]; then
  tc -s qdisc show dev lo
fi
exit "$status"
