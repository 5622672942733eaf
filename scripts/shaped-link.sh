#!/usr/bin/env bash
# Runs an MPI job on this host with the link between its ranks shaped to a rate (and a
# delay), as if every rank had a NIC of its own on a switch: each rank runs in a network
# namespace of its own whose only link is one end of a veth pair; the other ends are ports
# of a bridge (the "switch") in a namespace that holds mpirun. tc shapes each port in both
# directions, so a link is full duplex with the rate in each direction (what an Ethernet
# link is), and OpenMPI moves every message over TCP on those links (--mca btl tcp,self:
# no shared-memory shortcut). Used by tests and benchmarks to give CPU ranks a link that
# costs wire time, not cores (docs/runtime.md).
#
#   scripts/shaped-link.sh [--rate RATE] [--delay DELAY] [--burst SIZE] [--mtu BYTES] [--stats] -np N -- CMD ARGS...
#
#   --rate RATE    tc rate of each direction of each rank's link: 1gbit, 500mbit, ...
#                  (default 1gbit); "none" leaves the links unshaped
#   --delay DELAY  one-way delay added by netem on each rank's outgoing side (e.g. 100us;
#                  default none): needs the kernel's sch_netem, and says so when it is missing
#   --burst SIZE   tbf bucket (default 32kb): bytes that cross at once after an idle gap.
#                  A bucket as large as a message makes the link free after every pause (a
#                  256 KiB bucket let a 256 KiB collective that followed compute cross in a
#                  sixth of its time); a small one costs more timer wake-ups
#   --mtu BYTES    MTU of the links (default 9000, jumbo frames as in a data centre)
#   --stats        print each rank's link counters after the job (bytes that were shaped)
#   -np N          ranks (mpirun -np)
#
# Needs root (network namespaces, veth, a bridge, tc). Without it, or without unshare,
# nsenter, ip or tc (Debian: util-linux, iproute2), it prints why and exits 77, the status
# the tests read as "skipped". Nothing outside the job changes: it runs in a new network and
# mount namespace (unshare --net --mount) whose namespaces, links and tc rules disappear
# when the job ends, however it ends.
set -euo pipefail

skip() {
  echo "shaped-link: skipped: $*" >&2
  exit 77
}
usage() {
  echo "usage: shaped-link.sh [--rate RATE] [--delay DELAY] [--burst SIZE] [--mtu BYTES] [--stats] -np N -- CMD ARGS..." >&2
  exit 2
}

# Internal: how mpirun starts each rank, inside its own namespace.
if [[ ${1:-} == --rank-exec ]]; then
  shift
  exec nsenter --net="/run/netns/rank${OMPI_COMM_WORLD_RANK:?not started by mpirun}" -- "$@"
fi

rate=1gbit delay="" burst=32kb mtu=9000 stats=0 ranks="" inside=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rate) rate=${2:?}; shift 2 ;;
    --delay) delay=${2:?}; shift 2 ;;
    --burst) burst=${2:?}; shift 2 ;;
    --mtu) mtu=${2:?}; shift 2 ;;
    --stats) stats=1; shift ;;
    -np) ranks=${2:?}; shift 2 ;;
    --inside) inside=1; shift ;;  # internal: already in the new namespaces
    --) shift; break ;;
    *) usage ;;
  esac
done
[[ $# -gt 0 && $ranks =~ ^[1-9][0-9]*$ && $ranks -le 250 && $mtu =~ ^[0-9]+$ ]] || usage

if [[ $inside == 0 ]]; then
  [[ $(id -u) == 0 ]] || skip "needs root for network namespaces and tc (running as uid $(id -u))"
  for program in unshare nsenter ip tc mpirun; do
    command -v "$program" >/dev/null 2>&1 ||
      skip "$program not found (Debian: util-linux, iproute2, openmpi-bin; scripts/install-deps.sh)"
  done
  args=(--rate "$rate" --burst "$burst" --mtu "$mtu" -np "$ranks")
  [[ -n $delay ]] && args+=(--delay "$delay")
  [[ $stats == 1 ]] && args+=(--stats)
  unshare --net --mount -- true 2>/dev/null ||
    skip "cannot create network and mount namespaces (unshare --net --mount: a container without CAP_SYS_ADMIN?)"
  # The namespaces live as long as this one process: nothing to clean up after it. The
  # mount namespace keeps the per-rank namespaces' names (a tmpfs on /run/netns) private.
  exec unshare --net --mount -- "$0" --inside "${args[@]}" -- "$@"
fi

# In the new namespaces: the switch, then one namespace and shaped link per rank.
mkdir -p /run/netns
mount -t tmpfs dhelix-shaped-link /run/netns || skip "cannot mount a tmpfs on /run/netns"
ip link set lo up
ip link add switch type bridge 2>/dev/null || skip "cannot create a bridge (kernel module bridge)"
ip link set switch mtu "$mtu" up
ip addr add 10.77.0.254/24 dev switch
shape() { # shape DEV [ip -n NS]: tbf (and netem) on DEV's outgoing queue
  local dev=$1 netem=$2
  shift 2
  local parent=(root)
  if [[ $netem == 1 ]]; then
    tc "$@" qdisc add dev "$dev" root handle 1: netem delay "$delay" 2>/dev/null ||
      skip "tc netem is not available in this kernel (module sch_netem), so --delay cannot work"
    parent=(parent 1:1)
  fi
  if [[ $rate != none ]]; then
    tc "$@" qdisc add dev "$dev" "${parent[@]}" handle 10: tbf rate "$rate" burst "$burst" latency 100ms
  fi
}
for ((r = 0; r < ranks; ++r)); do
  ns=rank$r
  ip netns add "$ns" || skip "cannot create the network namespace of rank $r (ip netns add)"
  ip link add "port$r" type veth peer name eth0 netns "$ns" 2>/dev/null ||
    skip "cannot create a veth pair (kernel module veth)"
  ip link set "port$r" mtu "$mtu" master switch up
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 mtu "$mtu" up
  ip -n "$ns" addr add "10.77.0.$((r + 1))/24" dev eth0
  shape eth0 "$([[ -n $delay ]] && echo 1 || echo 0)" -n "$ns"  # what rank r sends
  shape "port$r" 0                                             # what rank r receives
done

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The ranks reach mpirun's PMIx server over the switch (its default, the loopback, is not
# theirs), and each other only over their shaped links.
export PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=switch
status=0
mpirun --oversubscribe -np "$ranks" --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 \
  --mca oob_tcp_if_include lo "$0" --rank-exec "$@" || status=$?
if [[ $stats == 1 ]]; then
  for ((r = 0; r < ranks; ++r)); do
    echo "rank $r sends through:"
    tc -n "rank$r" -s qdisc show dev eth0
  done
fi
exit "$status"
