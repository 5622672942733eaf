#!/usr/bin/env bash
# The baselines as people run them (docs/pipeline.md, "The baselines as people run them"),
# through dhelix-plan on the tiny example jobs:
#  - a dense job: megatron-a2a-overlap is exactly megatron-interleaved (no all-to-all to hide);
#  - a MoE job: both hand-written schemes are planned, the best baseline is one of the
#    schemes people run and the generous dualpipev is the upper bound, never the best baseline;
#  - PP > 1 with virtual pipeline size 1: megatron-a2a-overlap is absent and the report says why;
#  - m < 2·pp: dualpipev-handwritten is absent and the report says why.
# Usage: handwritten_baselines_test.sh <dir-with-binaries> <source-dir>
set -u

bin_dir=$(cd "$1" && pwd)
src_dir=$(cd "$2" && pwd)
plan="$bin_dir/dhelix-plan"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok    $1"; }
fail() { failed=$((failed + 1)); echo "FAIL  $1: $2"; }

report() {  # report NAME JOB [OPTIONS...]: the JSON report in $scratch/NAME.json
  local name=$1 job=$2
  shift 2
  if ! "$plan" "$src_dir/examples/jobs/$job.json" "$@" --report json -o "$scratch/$name.plan.json" \
    >"$scratch/$name.json" 2>"$scratch/$name.err"; then
    fail "$name" "dhelix-plan failed: $(head -3 "$scratch/$name.err")"
    return 1
  fi
}

check() {  # check NAME PYTHON: the python expression over `r` (the report) must hold
  if /usr/bin/python3 - "$scratch/$1.json" "$2" <<'PY'; then pass "$1: $2"; else fail "$1" "$2"; fi
import json, sys
r = json.load(open(sys.argv[1]))
s = {x["scheme"]: x for x in r["schemes"]}
sys.exit(0 if eval(sys.argv[2]) else 1)
PY
}

if report dense tiny-tp2-pp2; then
  check dense 's["megatron-a2a-overlap"]["iteration_us"] == s["megatron-interleaved"]["iteration_us"]'
  check dense 's["megatron-a2a-overlap"]["bubble_ratio"] == s["megatron-interleaved"]["bubble_ratio"]'
fi
if report moe tiny-moe-ep2-pp2; then
  check moe '"dualpipev-handwritten" in s and "megatron-a2a-overlap" in s'
  check moe 's["dualpipev-handwritten"]["iteration_us"] >= s["dualpipev"]["iteration_us"]'
  check moe 'r["best_baseline"]["scheme"] in ("megatron-1f1b", "megatron-interleaved", "zb-h1", "zb-v", "dualpipev-handwritten", "megatron-a2a-overlap")'
  check moe 'r["upper_bound"]["scheme"] == "dualpipev" and r["absent_baselines"] == []'
fi
if report nointerleave tiny-moe-ep2-pp2 --virtual-pipeline-model-parallel-size 1; then
  check nointerleave '"megatron-a2a-overlap" not in s and "dualpipev-handwritten" in s'
  check nointerleave 'any(a.startswith("megatron-a2a-overlap: Megatron-Core runs --overlap-moe-expert-parallel-comm with PP > 1 only on interleaved stages") for a in r["absent_baselines"])'
fi
if report fewmb tiny-moe-ep2-pp2 --gbs 4; then
  check fewmb '"dualpipev-handwritten" not in s and "dualpipev" not in s'
  check fewmb 'any(a.startswith("dualpipev-handwritten: DualPipeV needs at least 2") for a in r["absent_baselines"])'
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
