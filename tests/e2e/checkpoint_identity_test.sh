#!/usr/bin/env bash
# Checkpoints in the wrong place are refused, never trained on (issue 37; the run identity of
# docs/data-and-checkpoints.md). dhelix-run on 2 ranks (tiny-tp2), every run under `timeout`
# so that a hang fails instead of sticking:
#   1. every file of a checkpoint (latest, manifest.json, each shard, run.lock) replaced by a
#      directory or a FIFO: an error naming it, printed once, exit 2 or 3, no crash, no hang;
#   2. step 4's rank-1 shard replaced by step 2's (a valid shard of the same size): refused,
#      exit 2 (it hung: the ranks resumed different steps);
#   3. rank 0's and rank 1's shards exchanged: refused, exit 2 (it trained a scrambled model);
#   4. a second run on a --checkpoint-dir a live run holds: refused at start by name, and
#      every checkpoint left there is the first run's (it mixed the two runs' shards);
#   5. the job planned again (another date and command line, the same training) resumes, bit
#      for bit like a straight run; a plan that trains otherwise is still refused.
# A refused run leaves the checkpoint directory as it was.
# Usage: checkpoint_identity_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=${1:?usage: checkpoint_identity_test.sh BIN_DIR SOURCE_DIR}
src=${2:?usage: checkpoint_identity_test.sh BIN_DIR SOURCE_DIR}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
corpus=$src/examples/data/corpus.txt
plan=$src/examples/plans/tiny-tp2.json
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
run() { # run ARGS...: 2 ranks of dhelix-run, at most 60 s; $work/out, $work/err, $work/status
  local status=0
  timeout -k 10 60 mpirun --oversubscribe -np 2 "$bin/dhelix-run" --data "$corpus" --no-progress \
    "$@" >"$work/out" 2>"$work/err" || status=$?
  echo "$status" >"$work/status"
}
# What a directory holds: every entry's type, size and content hash.
snapshot() {
  (cd "$1" && find . -printf '%p %y %s\n' | sort && find . -type f -print0 | sort -z |
    xargs -0 -r sha256sum)
}
# expect_refused WHAT STATUS FRAGMENT DIR ARGS...: exit STATUS (124: hung), FRAGMENT in the
# error, printed by one rank only, no internal error, no MPI_Abort, DIR left unchanged.
expect_refused() {
  local what=$1 status=$2 fragment=$3 dir=$4
  shift 4
  local before
  before=$(snapshot "$dir")
  run "$@"
  local got prefixes repeats
  got=$(cat "$work/status")
  prefixes=$({ grep "error:" "$work/err" || true; } | sed 's/: error:.*//' | sort -u | wc -l)
  repeats=$({ grep "error:" "$work/err" || true; } | sort | uniq -d | wc -l)
  if [[ $got == 124 || $got == 137 ]]; then
    fail "$what: dhelix-run hung (killed after 60 s)"
  elif [[ $got != "$status" ]]; then
    fail "$what: exit $got, expected $status"
    cat "$work/out" "$work/err"
  elif ! grep -qF -- "$fragment" "$work/err" || [[ $prefixes != 1 || $repeats != 0 ]]; then
    fail "$what: expected the error with '$fragment' once, from one rank:"
    cat "$work/err"
  elif grep -q "internal error\|MPI_ABORT" "$work/err"; then
    fail "$what: an internal error or MPI_Abort:"
    cat "$work/err"
  fi
  [[ $(snapshot "$dir") == "$before" ]] || fail "$what: the refused run changed $dir"
}

# A checkpoint directory with steps 2 and 4, copied for each case.
run --plan "$plan" --steps 4 --checkpoint-every 2 --checkpoint-dir "$work/base"
if [[ $(cat "$work/status") != 0 || $(cat "$work/base/latest" 2>/dev/null) != step-4 ]]; then
  cat "$work/out" "$work/err"
  echo "FAIL: the base checkpoint was not written"
  exit 1
fi
resume=(--plan "$plan" --steps 6 --resume)

# 1. Checkpoint files that are directories or FIFOs.
n=0
for file in latest step-4/manifest.json step-4/rank-0.bin step-4/rank-1.bin run.lock; do
  for kind in directory fifo; do
    n=$((n + 1))
    dir=$work/odd-$n
    cp -r "$work/base" "$dir"
    rm -f "$dir/$file"
    if [[ $kind == fifo ]]; then mkfifo "$dir/$file"; else mkdir "$dir/$file"; fi
    case $file in
      latest | */manifest.json) want=(3 "$dir/$file: is a") ;;
      *.bin) want=(2 "$dir/$file: is not a regular file") ;;
      run.lock) want=(3 "$dir/$file: is not a regular file") ;;
    esac
    expect_refused "$file as a $kind" "${want[0]}" "${want[1]}" "$dir" "${resume[@]}" \
      --checkpoint-dir "$dir"
  done
done

# 2. A valid shard of another step.
cp -r "$work/base" "$work/stale"
cp "$work/stale/step-2/rank-1.bin" "$work/stale/step-4/rank-1.bin"
expect_refused "step 2's shard in step 4" 2 "$work/stale/step-4/rank-1.bin: holds step 2 but" \
  "$work/stale" "${resume[@]}" --checkpoint-dir "$work/stale"

# 3. Shards of two ranks exchanged.
cp -r "$work/base" "$work/swapped"
mv "$work/swapped/step-4/rank-0.bin" "$work/swapped/step-4/swap"
mv "$work/swapped/step-4/rank-1.bin" "$work/swapped/step-4/rank-0.bin"
mv "$work/swapped/step-4/swap" "$work/swapped/step-4/rank-1.bin"
expect_refused "shards of ranks 0 and 1 exchanged" 2 \
  "$work/swapped/step-4/rank-0.bin: holds the shard of rank 1 (pp 0, tp 1, cp 0, ep 0, dp 0)" \
  "$work/swapped" "${resume[@]}" --checkpoint-dir "$work/swapped"

# 4. Two runs on one directory: the first checkpoints every step for a while (random sleeps
#    of up to 2 ms before each op make its 30 steps last 10 s or more on any machine); the
#    second starts once the first has written step 1.
shared=$work/shared
timeout -k 10 300 mpirun --oversubscribe -np 2 "$bin/dhelix-run" --data "$corpus" --no-progress \
  --plan "$plan" --steps 30 --jitter-us 2000 --checkpoint-every 1 --checkpoint-dir "$shared" \
  >"$work/first.out" 2>"$work/first.err" &
first=$!
for _ in $(seq 600); do
  [[ -e $shared/step-1/manifest.json ]] && break
  sleep 0.1
done
run --plan "$plan" --steps 3 --checkpoint-every 1 --checkpoint-dir "$shared"
second=$(cat "$work/status")
cp "$work/err" "$work/second.err"
kill -0 "$first" 2>/dev/null || fail "the first run ended before the second was refused: inconclusive"
first_status=0
wait "$first" || first_status=$?
if [[ $second != 2 ]] || ! grep -qF "$shared/run.lock: the checkpoint directory $shared is in use by another dhelix-run (run " "$work/second.err"; then
  fail "a second run on a directory in use: exit $second, expected 2 and the holder named"
  cat "$work/second.err"
fi
[[ $first_status == 0 ]] || { fail "the first run: exit $first_status"; cat "$work/first.err"; }
# Every checkpoint is the first run's: one run id in every manifest and shard (bytes 160..191).
python3 - "$shared" <<'PY' || fail "the shared directory holds shards of another run"
import glob, json, sys
ids = set()
for manifest in glob.glob(f"{sys.argv[1]}/step-*/manifest.json"):
    ids.add(json.load(open(manifest))["run_id"])
    for shard in glob.glob(manifest.replace("manifest.json", "rank-*.bin")):
        ids.add(open(shard, "rb").read()[160:192].decode())
print(f"run ids in {sys.argv[1]}: {sorted(ids)}")
sys.exit(0 if len(ids) == 1 else 1)
PY
[[ ! -e $shared/run.lock ]] || fail "the first run left its lock file"
run --plan "$plan" --steps 32 --resume --checkpoint-dir "$shared"
[[ $(cat "$work/status") == 0 ]] || { fail "resuming the first run's checkpoint"; cat "$work/err"; }

# 5. Planned again: the same training under another date and command line.
"$bin/dhelix-plan" "$src/examples/jobs/tiny-tp2.json" -o "$work/plan-a.json" >/dev/null
sleep 1
"$bin/dhelix-plan" "$src/examples/jobs/tiny-tp2.json" -o "$work/plan-b.json" >/dev/null
"$bin/dhelix-plan" "$src/examples/jobs/tiny-tp2.json" --recompute-granularity full \
  -o "$work/plan-c.json" >/dev/null
cmp -s "$work/plan-a.json" "$work/plan-b.json" && fail "the two plans are byte-identical: no test"
run --plan "$work/plan-a.json" --steps 4 --loss-log "$work/straight.log"
run --plan "$work/plan-a.json" --steps 2 --checkpoint-dir "$work/replanned" --loss-log "$work/resumed.log"
run --plan "$work/plan-b.json" --steps 4 --resume --checkpoint-dir "$work/replanned" \
  --loss-log "$work/resumed.log"
if [[ $(cat "$work/status") != 0 ]]; then
  fail "resuming under the same job planned again: exit $(cat "$work/status")"
  cat "$work/err"
elif ! cmp -s "$work/straight.log" "$work/resumed.log"; then
  fail "resumed under the re-planned job, the losses differ from the straight run"
  diff "$work/straight.log" "$work/resumed.log" || true
fi
expect_refused "a plan that trains otherwise" 2 "the checkpoint was written under another plan" \
  "$work/replanned" --plan "$work/plan-c.json" --steps 6 --resume --checkpoint-dir "$work/replanned"

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "checkpoint identity: all passed"
