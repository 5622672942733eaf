#!/usr/bin/env bash
# dhelix-run under mpirun speaks once, not once per rank:
#   1. an error every rank meets (a missing plan, an unknown flag, a resume without a
#      checkpoint, a plan the checker refuses on rank 0 alone) is printed on one line by one
#      rank, the run ends with its status, and no rank calls MPI_Abort (OpenMPI's banner);
#   2. --help is printed once;
#   3. a finished run ends with one summary line on rank 0: steps, tokens/s, the final loss
#      (the last step's), the time and whether a checkpoint was written.
# Usage: run_messages_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=${1:?usage: run_messages_test.sh BIN_DIR SOURCE_DIR}
src=${2:?usage: run_messages_test.sh BIN_DIR SOURCE_DIR}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
corpus=$src/examples/data/corpus.txt
plan=$src/examples/plans/tiny-tp2-pp2.json
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
run() { # run ARGS...: 4 ranks of dhelix-run; stdout to $work/out, stderr to $work/err
  local status=0
  mpirun --oversubscribe -np 4 "$bin/dhelix-run" "$@" >"$work/out" 2>"$work/err" || status=$?
  echo "$status" >"$work/status"
}

# expect_once STATUS FRAGMENT ARGS...: exit STATUS; the error printed by one rank only (every
# "error:" line has the same "dhelix-run[ (rank N)]" prefix, none repeats: a message of several
# problems is several lines), FRAGMENT in it; no MPI_Abort.
expect_once() {
  local status=$1 fragment=$2
  shift 2
  run "$@"
  local prefixes repeats
  prefixes=$(grep "error:" "$work/err" | sed 's/: error:.*//' | sort -u | wc -l)
  repeats=$(grep "error:" "$work/err" | sort | uniq -d | wc -l)
  if [[ $(cat "$work/status") != "$status" ]]; then
    fail "dhelix-run $*: exit $(cat "$work/status"), expected $status"
    cat "$work/err"
  elif ! grep -qF -- "$fragment" "$work/err" || [[ $prefixes != 1 || $repeats != 0 ]]; then
    fail "dhelix-run $*: expected the error with '$fragment' once, from one rank:"
    cat "$work/err"
  elif grep -q "MPI_ABORT" "$work/err"; then
    fail "dhelix-run $*: MPI_Abort was called for an error every rank agreed on:"
    cat "$work/err"
  fi
}

# 1. Errors once.
expect_once 3 "dhelix-run: error: $work/missing.json: cannot open file for reading" \
  --plan "$work/missing.json" --data "$corpus" --steps 1
expect_once 2 "--tensor-parallel" --plan "$plan" --data "$corpus" --tensor-parallel 2
# --watchdog-s (cuda backend): the flag, the value and the rule.
expect_once 2 "--watchdog-s: 0 is too small: give a whole number from 1 to 86400" \
  --plan "$plan" --data "$corpus" --steps 1 --backend cuda --watchdog-s 0
expect_once 2 "--watchdog-s: \"5s\" is not an integer" --plan "$plan" --data "$corpus" \
  --steps 1 --backend cuda --watchdog-s 5s
expect_once 2 "--watchdog-s 30: the watchdog watches CUDA streams and NCCL communicators; it needs \
--backend cuda (the backend is cpu)" --plan "$plan" --data "$corpus" --steps 1 --watchdog-s 30
expect_once 2 "holds no checkpoint" --plan "$plan" --data "$corpus" --steps 1 --resume \
  --checkpoint-dir "$work/empty"
# Rank 0 alone checks the plan: the other ranks stop without a word of their own.
python3 - "$plan" "$work/reordered.json" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
tasks = plan["stages"][1]["tasks"]
tasks[0], tasks[2] = tasks[2], tasks[0]
for i, task in enumerate(tasks):
    task["index"] = i
json.dump(plan, open(sys.argv[2], "w"))
PY
expect_once 2 "is used before it is produced" --plan "$work/reordered.json" --data "$corpus" \
  --steps 1
grep -q "another rank\|rank [0-9] failed" "$work/err" && fail "ranks reported each other's failure"

# 2. --help once.
run --help
[[ $(grep -c "^Exit statuses:" "$work/out") == 1 ]] || fail "--help printed $(grep -c "^Exit statuses:" "$work/out") times"

# 3. The summary line, with and without a checkpoint.
summary_re='^dhelix-run: done: 3 steps \(1\.\.3\) in [0-9]+\.[0-9]{2} s, [0-9]+ tokens/s, final loss [0-9]+\.[0-9]{4}, '
run --plan "$plan" --data "$corpus" --steps 3 --checkpoint-dir "$work/ckpt"
last=$(tail -n 1 "$work/out")
if [[ $(cat "$work/status") != 0 ]] || ! [[ $last =~ ${summary_re}checkpoint\ $work/ckpt/step-3\ written$ ]]; then
  fail "no summary line with the checkpoint; the output ends: $last"
  cat "$work/out" "$work/err"
fi
# The final loss is step 3's.
step3=$(grep -oE '^step +3/3 +loss [0-9.]+' "$work/out" | awk '{print $4}')
[[ $last == *"final loss $step3,"* ]] || fail "final loss differs from step 3's ($step3): $last"
[[ $(grep -c "^dhelix-run: done:" "$work/out") == 1 ]] || fail "the summary is printed more than once"
run --plan "$plan" --data "$corpus" --steps 3 --no-progress
last=$(tail -n 1 "$work/out")
[[ $last =~ ${summary_re}no\ checkpoint\ written\ \(no\ --checkpoint-dir\)$ ]] ||
  fail "no summary line without a checkpoint; the output ends: $last"

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "dhelix-run messages: all passed"
