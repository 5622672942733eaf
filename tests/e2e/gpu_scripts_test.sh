#!/usr/bin/env bash
# The GPU machine scripts in the mode every machine without a GPU runs them in
# (DHELIX_NO_GPU=1 forces it where a GPU is visible):
#   * scripts/gpu-check.sh: exit 0; each GPU step a SKIP that says "no GPU"; the one-rank
#     plans it would run are made and trained on the CPU backend (a renamed flag or a job
#     the tools refuse FAILs here, not on lent device time);
#   * scripts/gpu-first-light.sh: exit 0; every job it would profile is accepted by the
#     model backend, and the runtime job plans;
#   * scripts/profile-table.py against hand-computed errors: a profile against itself is
#     0 %, against a copy with one op's time doubled +100 % for that op (the model slower
#     than measured: the predicted column is the copy);
#   * bash -n and shellcheck (where installed) on the three shell scripts.
# Usage: gpu_scripts_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$(cd "${1:?usage: gpu_scripts_test.sh BUILD_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: gpu_scripts_test.sh BUILD_DIR SOURCE_DIR}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
export DHELIX_NO_GPU=1 DHELIX_BUILD_DIR=$build

scripts=("$src/scripts/gpu-lib.sh" "$src/scripts/gpu-check.sh" "$src/scripts/gpu-first-light.sh")
for script in "${scripts[@]}"; do
  bash -n "$script" || fail "bash -n ${script#"$src"/}"
done
if command -v shellcheck >/dev/null 2>&1; then
  shellcheck "${scripts[@]}" || fail "shellcheck (.shellcheckrc follows gpu-lib.sh)"
else
  echo "shellcheck not installed: skipped (scripts/install-deps.sh installs it)"
fi

# expect_line SUMMARY STATUS NAME TEXT: the summary has STATUS NAME ... TEXT on one line.
expect_line() {
  grep -qE "^$2 +$3 .*$4" "$1" || fail "${1##*/}: no '$2 $3 ... $4' line"
}

# gpu-check.sh
BUDGET_S=300 timeout 600 "$src/scripts/gpu-check.sh" "$work/check" >"$work/check.out" 2>&1
status=$?
summary=$work/check/summary.txt
[ "$status" -eq 0 ] || fail "gpu-check.sh: exit $status, expected 0"
for step in build gpu-tests verify-tiny verify-tiny-recompute verify-tiny-moe profile-cuda; do
  expect_line "$summary" SKIP "$step" "no GPU"
done
expect_line "$summary" PASS train-tiny-cpu "loss"
expect_line "$summary" PASS train-tiny-moe-cpu "loss"
grep -q '^FAIL' "$summary" && fail "gpu-check.sh: a FAIL line without a GPU"
grep -q 'not checked with one GPU' "$summary" || fail "gpu-check.sh: does not say what one GPU cannot check"
for plan in tiny tiny-recompute tiny-moe; do
  [ -s "$work/check/plans/$plan.json" ] || fail "gpu-check.sh: no plan $plan.json"
done

# gpu-first-light.sh
BUDGET_S=300 timeout 600 "$src/scripts/gpu-first-light.sh" "$work/light" >"$work/light.out" 2>&1
status=$?
summary=$work/light/summary.txt
[ "$status" -eq 0 ] || fail "gpu-first-light.sh: exit $status, expected 0"
for job in llama3-8b llama3-70b-tp8-slice attention-d128-s4096 attention-d64-s16384 mixtral-experts; do
  expect_line "$summary" SKIP "op-table-$job" "no GPU \(job checked: [1-9][0-9]* ops modelled\)"
done
expect_line "$summary" SKIP interference "no GPU"
expect_line "$summary" SKIP runtime-mfu "no GPU \(the job plans"
grep -q '^FAIL' "$summary" && fail "gpu-first-light.sh: a FAIL line without a GPU"

# profile-table.py against hand-computed errors
profile=$work/light/profiles/llama3-8b-model.json
table=$src/scripts/profile-table.py
if [ -s "$profile" ]; then
  "$table" "$profile" "$profile" >"$work/self.md" || fail "profile-table.py: exit $? on a profile and itself"
  grep -q 'mean absolute error 0.0 %' "$work/self.md" || fail "profile-table.py: a profile against itself is not 0 %"
  python3 - "$profile" "$work/doubled.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["ops"][0]["time_us"]["median"] *= 2
json.dump(p, open(sys.argv[2], "w"))
PY
  first=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["ops"][0]["signature"])' "$profile")
  "$table" "$profile" "$work/doubled.json" >"$work/doubled.md"
  grep -F "\`$first\`" "$work/doubled.md" | grep -q '+100.0 %' || fail "profile-table.py: doubling $first is not +100.0 %"
  "$table" --families "$profile" >"$work/families.txt" || fail "profile-table.py --families: exit $?"
  grep -qE '^gemm +[0-9]+ ' "$work/families.txt" || fail "profile-table.py --families: no gemm row"
  "$table" "$profile" >/dev/null 2>&1 && fail "profile-table.py: one profile without --families accepted"
else
  fail "gpu-first-light.sh left no model profile of llama3-8b"
fi

if ((failures > 0)); then
  echo "--- gpu-check.sh summary"
  cat "$work/check/summary.txt" 2>/dev/null
  echo "--- gpu-first-light.sh summary"
  cat "$work/light/summary.txt" 2>/dev/null
  echo "$failures failure(s)"
  exit 1
fi
echo "gpu scripts: no-GPU mode passes, jobs and plans accepted, profile table exact"
