#!/usr/bin/env bash
# scripts/shaped-link.sh: 2 steps of the TP2 tiny plan with the ranks' link shaped to
# 200 Mbit/s (a network namespace per rank, veth links to a bridge shaped by tc tbf in both
# directions, OpenMPI over TCP). Checks that the job trains, that its messages went through
# the shaped queue (tc's byte counter), and that the losses are bit for bit those of the same 2 steps on the default transport.
# Skipped (77, with the script's reason) without root, unshare, nsenter, ip or tc.
# Usage: shaped_link_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=${1:?usage: shaped_link_test.sh BIN_DIR SOURCE_DIR}
src=${2:?usage: shaped_link_test.sh BIN_DIR SOURCE_DIR}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(--plan "$src/examples/plans/tiny-tp2.json" --data "$src/examples/data/corpus.txt" --steps 2)

status=0
"$src/scripts/shaped-link.sh" --rate 200mbit --stats -np 2 -- \
  "$bin/dhelix-run" "${args[@]}" --loss-log "$work/shaped.log" >"$work/out" 2>&1 || status=$?
if [[ $status == 77 ]]; then
  grep "skipped" "$work/out"
  exit 77
fi
cat "$work/out"
[[ $status == 0 ]] || { echo "FAIL: dhelix-run under a shaped link exited $status"; exit 1; }
grep -q "step    2/2" "$work/out" || { echo "FAIL: two steps not reported"; exit 1; }
sent=$(sed -n 's/^ *Sent \([0-9]*\) bytes.*/\1/p' "$work/out" | head -1)
# Two steps of TP2 move megabytes; the job's start-up alone moves a few kilobytes.
[[ -n $sent && $sent -gt 1000000 ]] || {
  echo "FAIL: the shaped queue carried ${sent:-no} bytes: the ranks did not talk over it"
  exit 1
}
mpirun -np 2 "$bin/dhelix-run" "${args[@]}" --loss-log "$work/plain.log" >/dev/null 2>&1
cmp -s "$work/shaped.log" "$work/plain.log" || {
  echo "FAIL: losses under the shaped link differ from the default transport's"
  diff "$work/plain.log" "$work/shaped.log" || true
  exit 1
}
echo "shaped link test: passed ($sent bytes sent by rank 0 through its shaped link)"
