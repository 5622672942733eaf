#!/usr/bin/env bash
# Profiles and cost figures that cannot be true are refused (docs/reliability.md,
# "Hardening 3: profiles and the cost model"). Usage: profile_sanity_test.sh <bin-dir> <src-dir>
#   1. hostile profiles made from a good one (dhelix-profile --backend model tiny-tp2):
#      all times 0, all 1e-300 us, all 1e300 us, and every op in turn at 0 us, and the
#      first pairs in turn finishing at 1e-300 us: exit 2, the file, the JSON pointer, the
#      value and the bound named, no plan written, no internal error;
#   2. a profile of another cluster (one figure changed at a time): the differing field named
#      with both values;
#   3. a GPU of 4 MiB (cluster file and inline cluster; plan and --search): exit 6 naming the
#      field, the value and the reserve, never "-2.00 GiB are usable";
#   4. Llama-3-8B on 8 H100 (TP 8, global batch 8): the iteration at sequence 1 is no longer
#      than at sequence 128 (it was 3.3 s against 0.17 s).
# The last line is "N passed, M failed"; the exit status is non-zero when anything failed.
set -u

bin_dir=$(cd "$1" && pwd)
src_dir=$(cd "$2" && pwd)
plan="$bin_dir/dhelix-plan"
profile_tool="$bin_dir/dhelix-profile"
job="$src_dir/examples/jobs/tiny-tp2.json"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1

passed=0
failed=0
pass() { passed=$((passed + 1)); }
fail() {
  failed=$((failed + 1))
  echo "FAIL  $1: $2"
}

# expect_refusal NAME STATUS FRAGMENT COMMAND...: COMMAND exits STATUS, its stderr holds
# FRAGMENT and no "internal error", and it writes no plan (out.json).
expect_refusal() {
  local name=$1 status=$2 fragment=$3
  shift 3
  rm -f out.json
  "$@" -o out.json >stdout 2>stderr
  local got=$?
  if [ "$got" -ne "$status" ]; then
    fail "$name" "exit $got, expected $status: $(head -c 400 stderr)"
  elif ! grep -qF -- "$fragment" stderr; then
    fail "$name" "stderr lacks '$fragment': $(head -c 600 stderr)"
  elif grep -q "internal error" stderr; then
    fail "$name" "internal error: $(head -c 400 stderr)"
  elif [ -e out.json ]; then
    fail "$name" "a plan was written"
  else
    pass
  fi
}

# edit_json IN OUT PYTHON: OUT is IN with the statement PYTHON applied to `d`.
edit_json() {
  /usr/bin/python3 - "$1" "$2" "$3" <<'PY'
import json, sys
src, dst, code = sys.argv[1:]
d = json.load(open(src))
exec(code)
json.dump(d, open(dst, "w"), indent=1)
PY
}

if ! "$profile_tool" --backend model "$job" -o good.json >/dev/null 2>stderr; then
  echo "FAIL  dhelix-profile --backend model: $(cat stderr)"
  echo "0 passed, 1 failed"
  exit 1
fi
expect_plan_ok() {
  if "$plan" "$job" --profile "$1" -o ok.json >stdout 2>stderr; then pass; else
    fail "$1 plans" "exit $?: $(head -c 400 stderr)"
  fi
}
expect_plan_ok good.json

# --- 1. impossible times --------------------------------------------------------------------
all_times='
for o in d["ops"]:
    for k in o["time_us"]: o["time_us"][k] = T
for p in d["pairs"]:
    p["finish_a_us"] = p["finish_b_us"] = p["makespan_us"] = T
    p["oef"] = 1.0
'
edit_json good.json zero.json "T = 0${all_times}"
expect_refusal "all times 0" 2 "zero.json: /ops/0/time_us/median: 0 us for op norm.fwd:fp32:rmsnorm:m=64,n=64: no op that does work takes zero time: it does 16384 FLOPs" \
  "$plan" "$job" --profile zero.json
edit_json good.json tiny.json "T = 1e-300${all_times}"
expect_refusal "all times 1e-300 us" 2 "tiny.json: /ops/1/time_us/median: 1e-300 us is faster than the hardware allows for op all_gather:fp32:bytes=32768:tp2:local: the 16384 bytes that must reach each of its 2 ranks need at least 0.08192 us at 200 GB/s (cluster intra_node.bandwidth_gbps)" \
  "$plan" "$job" --profile tiny.json
edit_json good.json huge.json "T = 1e300${all_times}"
expect_refusal "all times 1e300 us" 2 "huge.json: /ops/0/time_us/median: 1e+300 must be at most 1000000000000" \
  "$plan" "$job" --profile huge.json

# Every op in turn at 0 us (its pairs made consistent: finish times and makespan at least
# the other op's, OEF recomputed by the reader's rule).
ops=$(/usr/bin/python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["ops"]))' good.json)
for ((i = 0; i < ops; i++)); do
  edit_json good.json "op$i.json" "
i = $i
sig = d['ops'][i]['signature']
for k in d['ops'][i]['time_us']: d['ops'][i]['time_us'][k] = 0
med = {o['signature']: o['time_us']['median'] for o in d['ops']}
for p in d['pairs']:
    if sig not in (p['a'], p['b']): continue
    if p['a'] == sig: p['finish_a_us'] = 0
    if p['b'] == sig: p['finish_b_us'] = 0
    p['makespan_us'] = max(p['finish_a_us'], p['finish_b_us'])
    ta, tb = med[p['a']], med[p['b']]
    s = min(ta, tb)
    p['oef'] = 1.0 if s <= 0 else round(1 - (p['makespan_us'] - max(ta, tb)) / s, 4)
    p['oef'] = max(-1.0, min(1.0, p['oef']))
"
  expect_refusal "op $i at 0 us" 2 "op$i.json: /ops/$i/time_us/median: 0 us for op " \
    "$plan" "$job" --profile "op$i.json"
done

# The first pairs in turn: the op that finishes first finishes at 1e-300 us (makespan and
# OEF unchanged: the other op still finishes last).
for ((i = 0; i < 20; i++)); do
  side=$(/usr/bin/python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["pairs"][int(sys.argv[2])]
print("a" if p["finish_a_us"] <= p["finish_b_us"] else "b")' good.json "$i")
  edit_json good.json "pair$i.json" "d['pairs'][$i]['finish_${side}_us'] = 1e-300"
  expect_refusal "pair $i finish_${side}_us 1e-300" 2 \
    "pair$i.json: /pairs/$i/finish_${side}_us: 1e-300 us " \
    "$plan" "$job" --profile "pair$i.json"
done

# --- 2. a profile of another cluster ------------------------------------------------------
for field in "gpu/peak_bf16_tflops" "gpu/memory_bytes" "intra_node/latency_us" \
  "inter_node/bandwidth_gbps" "nccl_sms_intra_node" "num_nodes"; do
  name=${field//\//-}
  edit_json good.json "cluster-$name.json" "
keys = '$field'.split('/')
o = d['cluster']
for k in keys[:-1]: o = o[k]
old = o[keys[-1]]
o[keys[-1]] = old * 2 if isinstance(old, (int, float)) and old else 3
open('old-value', 'w').write(json.dumps(old))
open('new-value', 'w').write(json.dumps(o[keys[-1]]))
"
  expect_refusal "profile of another cluster ($field)" 2 \
    "cluster-$name.json: /cluster/$field: the profile was made for cluster cpu-host (GPU CPU rank) with $(cat new-value) there, but the job runs on cpu-host (GPU CPU rank) with $(cat old-value):" \
    "$plan" "$job" --profile "cluster-$name.json"
done

# --- 3. a GPU below the memory reserve --------------------------------------------------------
edit_json "$src_dir/examples/clusters/cpu-host.json" small-gpu.json \
  "d['gpu']['memory_bytes'] = 4194304"
edit_json "$job" small-job.json \
  "d['model'] = '$src_dir/examples/models/llama-tiny.json'; d['cluster'] = 'small-gpu.json'"
reserve="4194304 bytes (4.00 MiB) is no more than the memory every plan keeps free on a GPU, 2147693363 bytes (2.00 GiB: 5 % of the memory"
expect_refusal "4 MiB GPU (cluster file)" 6 "small-gpu.json: /gpu/memory_bytes: $reserve" \
  "$plan" small-job.json
edit_json small-job.json inline-job.json "d['cluster'] = json.load(open('small-gpu.json'))"
expect_refusal "4 MiB GPU (inline cluster)" 6 "inline-job.json: /cluster/gpu/memory_bytes: $reserve" \
  "$plan" inline-job.json
rm -f out.json
"$plan" small-job.json --search --gpus 2 >stdout 2>stderr
status=$?
if [ "$status" -ne 6 ] || ! grep -qF "small-gpu.json: /gpu/memory_bytes: $reserve" stderr; then
  fail "4 MiB GPU (--search)" "exit $status: $(head -c 400 stderr)"
else
  pass
fi
if grep -rqF -- "-2.00 GiB" stderr stdout; then fail "4 MiB GPU" "still -2.00 GiB"; else pass; fi

# --- 4. sequence 1 costs no more than sequence 128 ------------------------------------------
iteration_us() {
  "$plan" "$src_dir/examples/jobs/llama-3-8b-hf-h100.json" --dp 1 --tp 8 --no-sp --gbs 8 \
    --seq "$1" --report json 2>/dev/null |
    /usr/bin/python3 -c 'import json, sys
r = json.load(sys.stdin)
print(next(s["iteration_us"] for s in r["schemes"] if s["scheme"] == "megatron-1f1b"))'
}
previous=0
for seq in 1 8 32 128; do
  us=$(iteration_us "$seq")
  if [ -z "$us" ]; then
    fail "llama-3-8b seq $seq" "no report"
  elif /usr/bin/python3 -c "import sys; sys.exit(0 if $us >= $previous else 1)"; then
    pass
  else
    fail "llama-3-8b seq $seq" "iteration $us us is shorter than the shorter sequence's $previous us"
  fi
  previous=${us:-0}
done
first=$(iteration_us 1)
if /usr/bin/python3 -c "import sys; sys.exit(0 if $first < 0.5e6 else 1)"; then pass; else
  fail "llama-3-8b seq 1" "iteration $first us (it was 3.3 s)"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
