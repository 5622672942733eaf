#!/usr/bin/env bash
# End-to-end test of the measuring cpu profiler backend: profile -> plan on one machine.
# Usage: profile_cpu_test.sh <dir-with-binaries> <source-dir> <mpirun>
#   1. run alone (one rank), a tp-2 job is refused with the mpirun command to use, no file;
#   2. mpirun -np 2 dhelix-profile --backend cpu tiny-tp2.json -o p.json succeeds and
#      p.json is valid against schemas/profile.schema.json, says backend "cpu", has a
#      positive median for every op and 2 ranks in meta.measurement;
#   3. dhelix-plan tiny-tp2.json --profile p.json -o plan.json succeeds;
#   4. dhelix-run --verify trains that plan;
#   5. the same chain for tiny-cp2-tp2 (the CP ring's send/recv measured; 4 ranks train);
#   6. the same chain for the MoE job tiny-moe-ep2 (router, permutations, grouped GEMMs and
#      the EP all-to-all measured as the run does them): profile, plan, --verify.
#   7. the same chain for tiny-moe-ep2-tp2 (MoE with TP 2 and expert TP 2: the expert-TP
#      exchanges measured as the planner models them, an all-gather and a reduce-scatter
#      over TP; 2 ranks profile, 4 train).
# The last line is "N passed, M failed"; the exit status is non-zero when anything failed.
set -u

bin_dir=$(cd "$1" && pwd)
src_dir=$(cd "$2" && pwd)
mpirun=$3
profile="$bin_dir/dhelix-profile"
plan="$bin_dir/dhelix-plan"
job="$src_dir/examples/jobs/tiny-tp2.json"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok    $1"; }
fail() { failed=$((failed + 1)); echo "FAIL  $1: $2"; }

# --- 1. one rank cannot measure tp-2 collectives --------------------------------------------
"$profile" --backend cpu "$job" -o "$scratch/alone.json" >"$scratch/stdout" 2>"$scratch/stderr"
status=$?
expected="dhelix-profile: error: the cpu backend measures tp-2 collectives with 2 ranks: run mpirun -np 2 dhelix-profile ..., or a multiple of 2 (this run has 1 rank)"
if [ "$status" -ne 2 ]; then
  fail "one rank" "exit $status, expected 2"
elif [ "$(cat "$scratch/stderr")" != "$expected" ]; then
  fail "one rank" "stderr: $(cat "$scratch/stderr")"
elif [ -e "$scratch/alone.json" ]; then
  fail "one rank" "wrote a profile"
else
  pass "one rank refused: $expected"
fi

# --- 2. two ranks measure --------------------------------------------------------------------
start=$(date +%s.%N)
"$mpirun" --oversubscribe -np 2 "$profile" --backend cpu "$job" -o "$scratch/p.json" \
  >"$scratch/stdout" 2>"$scratch/stderr"
status=$?
seconds=$(awk -v end="$(date +%s.%N)" -v start="$start" 'BEGIN { printf "%.2f", end - start }')
if [ "$status" -ne 0 ]; then
  fail "mpirun -np 2 dhelix-profile --backend cpu" "exit $status: $(head -c 2000 "$scratch/stderr")"
else
  pass "mpirun -np 2 dhelix-profile --backend cpu ($seconds s)"
  if /usr/bin/python3 - "$scratch/p.json" "$src_dir/schemas/profile.schema.json" <<'PY'; then
import json, sys
import jsonschema
profile = json.load(open(sys.argv[1]))
schema = json.load(open(sys.argv[2]))
problems = ["/" + "/".join(str(p) for p in e.absolute_path) + ": " + e.message
            for e in jsonschema.Draft202012Validator(schema).iter_errors(profile)]
if profile["backend"] != "cpu":
    problems.append("backend is %r" % profile["backend"])
if profile["meta"].get("measurement", {}).get("ranks") != 2:
    problems.append("meta.measurement.ranks is not 2")
if len(profile["ops"]) == 0 or len(profile["pairs"]) == 0:
    problems.append("no ops or no pairs")
for op in profile["ops"]:
    t = op["time_us"]
    if not 0 < t["min"] <= t["p10"] <= t["median"] <= t["p90"] <= t["max"]:
        problems.append("%s: times not positive and ordered: %s" % (op["signature"], t))
for pair in profile["pairs"]:
    if not (pair["finish_a_us"] > 0 and pair["finish_b_us"] > 0 and -1 <= pair["oef"] <= 1):
        problems.append("%s x %s: %s" % (pair["a"], pair["b"], pair))
for p in problems[:5]:
    print(p)
sys.exit(1 if problems else 0)
PY
    pass "profile valid, backend cpu, positive times"
  else
    fail "profile contents" "see above"
  fi
fi

# --- 3. the measured profile plans ------------------------------------------------------------
if [ -s "$scratch/p.json" ]; then
  if "$plan" "$job" --profile "$scratch/p.json" -o "$scratch/plan.json" >"$scratch/stdout" \
    2>"$scratch/stderr" && [ -s "$scratch/plan.json" ]; then
    pass "dhelix-plan --profile p.json"
  else
    fail "dhelix-plan --profile p.json" "$(head -c 2000 "$scratch/stderr")"
  fi
fi

# --- 4. ... and the plan made from measured numbers trains, co-executed == sequential ---------
if [ -s "$scratch/plan.json" ]; then
  if "$mpirun" --oversubscribe -np 2 "$bin_dir/dhelix-run" --plan "$scratch/plan.json" \
    --data "$src_dir/examples/data/corpus.txt" --steps 1 --verify >"$scratch/stdout" \
    2>"$scratch/stderr" && grep -q "bitwise equal on 2 ranks" "$scratch/stdout"; then
    pass "dhelix-run --verify on the plan from the measured profile"
  else
    fail "dhelix-run --verify on the measured plan" "$(head -c 2000 "$scratch/stderr")"
  fi
fi

# --- 5. context parallelism: the ring's send/recv measured, planned, trained (4 ranks) -------
cp_job="$src_dir/examples/jobs/tiny-cp2-tp2.json"
if "$mpirun" --oversubscribe -np 2 "$profile" --backend cpu "$cp_job" -o "$scratch/cp.json" \
  >"$scratch/stdout" 2>"$scratch/stderr" &&
  grep -q '"send_recv:fp32:bytes=8192:cp2:local"' "$scratch/cp.json" &&
  "$plan" "$cp_job" --profile "$scratch/cp.json" -o "$scratch/cp-plan.json" >"$scratch/stdout" \
    2>"$scratch/stderr" &&
  "$mpirun" --oversubscribe -np 4 "$bin_dir/dhelix-run" --plan "$scratch/cp-plan.json" \
    --data "$src_dir/examples/data/corpus.txt" --steps 1 --verify >"$scratch/stdout" \
    2>"$scratch/stderr" && grep -q "bitwise equal on 4 ranks" "$scratch/stdout"; then
  pass "tiny-cp2-tp2: cpu profile (ring send/recv measured) -> plan -> dhelix-run --verify"
else
  fail "tiny-cp2-tp2 profile -> plan -> run" "$(head -c 2000 "$scratch/stderr")"
fi

# --- 6. the MoE chain: EP 2 on 2 ranks, profile -> plan -> run ------------------------------
moe_job="$src_dir/examples/jobs/tiny-moe-ep2.json"
if ! "$mpirun" --oversubscribe -np 2 "$profile" --backend cpu "$moe_job" -o "$scratch/moe.json" \
  >"$scratch/stdout" 2>"$scratch/stderr"; then
  fail "moe: mpirun -np 2 dhelix-profile --backend cpu" "$(head -c 2000 "$scratch/stderr")"
elif ! /usr/bin/python3 - "$scratch/moe.json" <<'PY'; then
import json, sys
ops = json.load(open(sys.argv[1]))["ops"]
kinds = {op["signature"].split(":")[0] for op in ops}
missing = [k for k in ("router", "permute", "unpermute", "grouped_gemm", "all_to_all")
           if not any(k in s for s in kinds)]
print("missing", missing, "in", sorted(kinds)) if missing else None
sys.exit(1 if missing else 0)
PY
  fail "moe profile" "not every MoE op kind measured (see above)"
elif ! "$plan" "$moe_job" --profile "$scratch/moe.json" -o "$scratch/moe-plan.json" \
  >"$scratch/stdout" 2>"$scratch/stderr"; then
  fail "moe: dhelix-plan --profile" "$(head -c 2000 "$scratch/stderr")"
elif "$mpirun" --oversubscribe -np 2 "$bin_dir/dhelix-run" --plan "$scratch/moe-plan.json" \
  --data "$src_dir/examples/data/corpus.txt" --steps 1 --verify >"$scratch/stdout" \
  2>"$scratch/stderr" && grep -q "bitwise equal on 2 ranks" "$scratch/stdout"; then
  pass "moe: profile -> plan -> dhelix-run --verify (tiny-moe-ep2)"
else
  fail "moe: dhelix-run --verify on the measured plan" "$(head -c 2000 "$scratch/stderr")"
fi

# --- 7. MoE with TP 2 and expert TP 2: profile on 2 ranks -> plan -> run on 4 -------------
etp_job="$src_dir/examples/jobs/tiny-moe-ep2-tp2.json"
if ! "$mpirun" --oversubscribe -np 2 "$profile" --backend cpu "$etp_job" -o "$scratch/etp.json" \
  >"$scratch/stdout" 2>"$scratch/stderr"; then
  fail "moe tp 2: mpirun -np 2 dhelix-profile --backend cpu" "$(head -c 2000 "$scratch/stderr")"
elif ! "$plan" "$etp_job" --profile "$scratch/etp.json" -o "$scratch/etp-plan.json" \
  >"$scratch/stdout" 2>"$scratch/stderr"; then
  fail "moe tp 2: dhelix-plan --profile" "$(head -c 2000 "$scratch/stderr")"
elif "$mpirun" --oversubscribe -np 4 "$bin_dir/dhelix-run" --plan "$scratch/etp-plan.json" \
  --data "$src_dir/examples/data/corpus.txt" --steps 1 --verify >"$scratch/stdout" \
  2>"$scratch/stderr" && grep -q "bitwise equal on 4 ranks" "$scratch/stdout"; then
  pass "moe tp 2: profile -> plan -> dhelix-run --verify (tiny-moe-ep2-tp2)"
else
  fail "moe tp 2: dhelix-run --verify on the measured plan" "$(head -c 2000 "$scratch/stderr")"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
