#!/usr/bin/env bash
# End-to-end tests of `dhelix-plan --search` (docs/search.md): the text and JSON reports,
# the JSON against schemas/search-report.schema.json, the plan -o writes (it checks and
# has the figures the report gave), the same bytes for any thread count, and the flags it
# refuses. Usage: search_test.sh <dir-with-binaries> <source-dir>
# The last line is "N passed, M failed"; the exit status is non-zero when anything failed.
set -u

bin_dir=$(cd "$1" && pwd)
src_dir=$(cd "$2" && pwd)
plan_tool="$bin_dir/dhelix-plan"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$src_dir"

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok    $1"; }
fail() { failed=$((failed + 1)); echo "FAIL  $1: $2"; }

# expect NAME STATUS STDERR-SUBSTRING ARGS...: runs dhelix-plan ARGS, checks the exit
# status and (when not empty) that stderr contains the substring.
expect() {
  local name=$1 want=$2 needle=$3
  shift 3
  "$plan_tool" "$@" >"$scratch/stdout" 2>"$scratch/stderr"
  local status=$?
  if [[ $status -ne $want ]]; then
    fail "$name" "exit $status, want $want; stderr: $(head -c 300 "$scratch/stderr")"
  elif [[ -n $needle ]] && ! grep -qF -- "$needle" "$scratch/stderr"; then
    fail "$name" "stderr lacks '$needle': $(head -c 300 "$scratch/stderr")"
  else
    pass "$name (exit $status)"
  fi
}

stdout_has() {
  if grep -qF -- "$2" "$scratch/stdout"; then pass "$1"; else fail "$1" "stdout lacks '$2'"; fi
}

# A space of a few seconds: Llama-8B on 8 H100s, no CP, recompute fixed, mbs 1 or 2.
space=(--model examples/models/llama-8b.json --cluster h100 --gpus 8 --gbs 16 --seq 4096
       --no-cp --no-recompute-search --search)

# 1. The text report names the best configuration of each scheme and the gain.
expect "text report" 0 "" "${space[@]}" --threads 2
stdout_has "text: counts" "configurations: "
stdout_has "text: best dhelix" "best dhelix:"
stdout_has "text: best Megatron" "best Megatron-LM 1F1B:"
stdout_has "text: gain" "gain of the best dhelix configuration over the best Megatron-LM one:"

expect "--all-schemes" 0 "" "${space[@]}" --threads 2 --all-schemes
stdout_has "--all-schemes: Wavelet+" "best wavelet+:"
stdout_has "--all-schemes: intra-batch" "best intra-batch:"

# 2. The JSON report: schema, counts that add up, a reason for every configuration not planned.
expect "json report" 0 "" "${space[@]}" --threads 2 --report json
cp "$scratch/stdout" "$scratch/two-threads.json"
if /usr/bin/python3 - "$scratch/two-threads.json" schemas/search-report.schema.json <<'PY'
import json, sys
import jsonschema
report = json.load(open(sys.argv[1]))
errors = list(jsonschema.Draft202012Validator(json.load(open(sys.argv[2]))).iter_errors(report))
for e in errors[:5]:
    print("/" + "/".join(str(p) for p in e.absolute_path) + ": " + e.message)
n = report["counts"]
configs = report["configurations"]
assert n["enumerated"] == len(configs), "enumerated count"
assert n["invalid"] + n["no_memory"] + n["pruned"] + n["planned"] == len(configs), "statuses"
for c in configs:
    assert c["status"] == "planned" or c.get("reason"), f"{c['label']}: no reason"
best = configs[report["best_dhelix"]]
times = [c["dhelix"]["iteration_us"] for c in configs
         if c["status"] == "planned" and c["dhelix"]["fits"]]
assert best["dhelix"]["iteration_us"] == min(times), "best is not the fastest"
for c in configs:
    if c["status"] == "planned":
        for scheme in ("dhelix", "megatron-1f1b"):
            assert c["lower_bound_us"][scheme] <= c[scheme]["iteration_us"], f"{c['label']}: bound"
sys.exit(1 if errors else 0)
PY
then pass "json: schema, counts, reasons, best, bounds"; else fail "json" "see above"; fi

# 3. Same bytes with one thread (provenance aside: argv differs).
expect "json one thread" 0 "" "${space[@]}" --threads 1 --report json
if /usr/bin/python3 - "$scratch/stdout" "$scratch/two-threads.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
a.pop("meta"); b.pop("meta")
sys.exit(0 if a == b else 1)
PY
then pass "same report for 1 and 2 threads"; else fail "threads" "reports differ"; fi

# 4. -o writes the best dhelix configuration's plan: it passes the checker and its figure
#    is the report's.
expect "-o writes the plan" 0 "" "${space[@]}" --threads 2 -o "$scratch/best.json"
stdout_has "-o is announced" "plan of the best dhelix configuration written to"
expect "the plan checks" 0 "" --check "$scratch/best.json"
if /usr/bin/python3 - "$scratch/best.json" "$scratch/two-threads.json" <<'PY'
import json, sys
plan, report = (json.load(open(f)) for f in sys.argv[1:])
best = report["configurations"][report["best_dhelix"]]
dhelix = next(s for s in plan["schemes"] if s["scheme"] == "dhelix")
assert abs(dhelix["iteration_us"] - best["dhelix"]["iteration_us"]) < 1e-3, "iteration time"  # the plan keeps 3 decimals
for key in ("tp", "cp", "pp", "dp", "micro_batch_size"):
    assert plan["job"]["parallel"][key] == best["parallel"][key], key
PY
then pass "the plan is the best configuration"; else fail "-o plan" "differs from the report"; fi

# 5. Flags the search refuses, with what to do instead.
expect "--gpus needs --search" 2 "--gpus" --model examples/models/llama-8b.json --cluster h100 \
  --tp 2 --dp 4 --gbs 16 --seq 4096 --gpus 8
expect "--search without --gpus" 2 "--gpus is required" --model examples/models/llama-8b.json \
  --cluster h100 --gbs 16 --seq 4096 --search
expect "--search --trace" 2 "--trace" "${space[@]}" --trace "$scratch/t.json"
expect "--search --report markdown" 2 "markdown" "${space[@]}" --report markdown
# (compared with a copy, not with git: a fresh machine's checkout may have no git)
cp examples/models/llama-8b.json "$scratch/model-before.json"
expect "-o onto the model" 2 "" "${space[@]}" -o examples/models/llama-8b.json
if cmp -s examples/models/llama-8b.json "$scratch/model-before.json"; then
  pass "the model file is untouched"
else
  fail "-o onto the model" "the model file changed"
fi

# 6. A rule only the planner states (MoE with TP needs SP) makes configurations invalid,
#    with the planner's words; the search goes on.
expect "planner refusals are invalid configurations" 0 "" \
  examples/jobs/phi-31b-a40-dp16-ep8-pp4.json --search --tp 2 --no-sp --max-pp 1 --mbs 1 \
  --no-cp --no-recompute-search
stdout_has "planner refusal: its reason" "need sequence parallelism"

# 7. Nothing fits: the report says so and -o writes nothing (exit 6, infeasible).
expect "nothing fits" 6 "none fits in memory" --model examples/models/hf/llama-3.1-405b.config.json \
  --cluster a40 --gpus 2 --gbs 2 --seq 4096 --no-cp --no-recompute-search --search \
  -o "$scratch/none.json"
if [[ ! -e $scratch/none.json ]]; then pass "no plan written"; else fail "nothing fits" "wrote a plan"; fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
