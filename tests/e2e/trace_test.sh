#!/usr/bin/env bash
# Measured timelines and predicted-versus-measured (docs/runtime.md):
#   1. dhelix-run --trace on TP2 x PP2 (4 ranks, co-executed) and TP2 (2 ranks, --sequential):
#      the trace is valid JSON and complete: every layer op of the plan (the pairing's
#      forward and backward ops, for each layer the rank's stage holds) exactly once per
#      micro-batch, per step and per rank; one iteration, dp_reduction and optimizer slice
#      per step and rank; every op inside its step's iteration slice (one clock per host);
#      co-executed ops on their plan stream's thread, sequential ones on the compute thread;
#      every rank's memory: one "memory rank R (stage S)" line per rank at the end of the run,
#      otherData.memory with a record per rank, and a "memory" counter track per rank with
#      an event at the start of each step's iteration;
#   2. dhelix-diff PLAN --measured TRACE on those traces (text, --json, --fail-if-off), and
#      on the checked-in pair tests/e2e/data/measured/ against its expected output; its
#      memory section: every rank's weights, gradients and optimizer states hold the plan
#      stage's parameters (the fp32 plans: weights and gradients +0.0 %, optimizer states
#      -33.33 %: 8 bytes per parameter against 12), the --json output matches
#      schemas/measured-diff.schema.json, and a trace whose record lacks 64 parameters fails
#      (exit 1) naming the rank;
#   3. dhelix-profile --from-trace: a profile from a --sequential and a co-executed trace of
#      TP2 (with a measured cpu profile as --base for what they do not time) is valid and
#      plans; its solo times are the traces' (fwd.flash_attn, alone in its signature: the
#      median of its slices); without --base the missing entries are listed;
#   4. --comm-wait spin with --pin-compute trains to the same loss bits as backoff (with 5 us
#      longest sleeps, unpinned);
#   5. bad input: --comm-max-sleep-us with --comm-wait spin, --trace with --verify, a plan's own trace given as measured, a trace of
#      another job.
# Usage: trace_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=${1:?usage: trace_test.sh BIN_DIR SOURCE_DIR}
src=${2:?usage: trace_test.sh BIN_DIR SOURCE_DIR}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plans=$src/examples/plans
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

check_trace() { # check_trace PLAN TRACE STEPS MODE
  python3 - "$@" <<'PY'
import json, sys
plan_file, trace_file, steps, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
plan = json.load(open(plan_file))
trace = json.load(open(trace_file))  # valid JSON, or this raises
assert trace["otherData"]["measured"] is True and trace["otherData"]["schedule"] == mode
stage_of = {e["pid"]: int(e["args"]["name"].split()[1])
            for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
tp, pp = plan["job"]["parallel"]["tp"], plan["job"]["parallel"]["pp"]
dp = plan["job"]["parallel"]["dp"]
assert len(stage_of) == tp * pp * dp, f"{len(stage_of)} ranks traced"
streams = {"compute": 1, "local_comm": 2, "cross_comm": 3}
problems = []
for rank, stage_index in stage_of.items():
    stage = plan["stages"][stage_index]
    pairing = plan["pairings"][stage["pairing"]]
    layers = [l for r in (stage["down_layers"], stage["up_layers"])
              for l in range(r["first"], r["first"] + r["count"])]
    expected = {}
    for step in range(steps):
        for mb in range(plan["num_micro_batches"]):
            for layer in layers:
                for op in pairing["forward_ops"] + pairing["backward_ops"]:
                    expected[(step, mb, layer, op["id"])] = streams[op["stream"]]
    seen, spans = {}, {}
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == rank]
    for e in slices:
        if e["cat"] == "step":
            spans.setdefault((e["args"]["step"], e["name"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for step in range(steps):
        for name in ("iteration", "dp_reduction", "optimizer"):
            if len(spans.get((step, name), [])) != 1:
                problems.append(f"rank {rank} step {step}: {len(spans.get((step, name), []))} {name} slices")
    for e in slices:
        if e["cat"] not in ("fwd", "bwd", "extra"):
            continue
        a = e["args"]
        start, end = spans[(a["step"], "iteration")][0]
        if not (start - 1 <= e["ts"] and e["ts"] + e["dur"] <= end + 1):
            problems.append(f"rank {rank}: {e['name']} outside its step's iteration")
        if "layer" not in a:
            continue
        if e["name"].startswith("p2p."):  # a pipeline send or receive: once each
            key = (a["step"], a["micro_batch"], a["layer"], e["name"], a["kind"])
            seen[key] = seen.get(key, 0) + 1
            if seen[key] != 1:
                problems.append(f"rank {rank}: {key} traced {seen[key]} times")
            continue
        key = (a["step"], a["micro_batch"], a["layer"], e["name"])
        seen[key] = seen.get(key, 0) + 1
        want = 1 if mode == "sequential" else expected.get(key)
        if key in expected and e["tid"] != want:
            problems.append(f"rank {rank}: {key} on thread {e['tid']}, expected {want}")
    missing = [k for k in expected if seen.get(k, 0) == 0]
    extra = [k for k in seen if len(k) == 4 and (k not in expected or seen[k] != 1)]
    if missing or extra:
        problems.append(f"rank {rank}: {len(missing)} ops missing (e.g. {missing[:2]}), "
                        f"{len(extra)} unexpected or repeated (e.g. {extra[:2]})")
for p in problems[:10]:
    print(p)
print(f"{trace_file}: {len(stage_of)} ranks, {steps} steps, {mode}: "
      f"{'complete' if not problems else 'INCOMPLETE'}")
sys.exit(1 if problems else 0)
PY
}

check_memory() { # check_memory TRACE RUN_OUTPUT STEPS
  python3 - "$@" <<'PY'
import json, re, sys
trace_file, out_file, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
trace = json.load(open(trace_file))
ranks = trace["otherData"]["ranks"]
records = trace["otherData"]["memory"]
assert [r["rank"] for r in records] == list(range(ranks)), records
for r in records:
    assert r["weight_bytes"] > 0 and r["weight_bytes"] == r["gradient_bytes"], r
    assert r["optimizer_bytes"] == 2 * r["weight_bytes"], r  # CPU: 8 against 4 per parameter
lines = [l for l in open(out_file) if l.startswith("memory rank ")]
pattern = (r"memory rank (\d+) \(stage (\d+)\): weights [0-9.]+ MiB, gradients [0-9.]+ MiB, "
           r"optimizer states [0-9.]+ MiB, activations [0-9.]+ MiB peak \(live peak [0-9.]+ MiB, of which the plan counts [0-9.]+ MiB\)$")
assert len(lines) == ranks, lines
for rank, line in enumerate(lines):
    m = re.match(pattern, line.strip())
    assert m and int(m.group(1)) == rank and int(m.group(2)) == records[rank]["stage"], line
    assert f"weights {records[rank]['weight_bytes'] / 2**20:.3f} MiB" in line, line
starts = {(e["pid"], e["args"]["step"]): e["ts"] for e in trace["traceEvents"]
          if e["ph"] == "X" and e["name"] == "iteration"}
counters = {}
for e in trace["traceEvents"]:
    if e["ph"] == "C":
        assert e["name"] == "memory" and e["args"]["activation_bytes"] >= 0, e
        counters.setdefault(e["pid"], []).append(e["ts"])
for (pid, step), ts in starts.items():
    assert any(abs(t - ts) < 1 for t in counters.get(pid, [])), (pid, step, "no counter event")
print(f"{trace_file}: memory of {ranks} ranks recorded, printed and counted")
PY
}

check_memory_diff() { # check_memory_diff DIFF_JSON RANKS SCHEMA
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
import jsonschema
diff, ranks = json.load(open(sys.argv[1])), int(sys.argv[2])
jsonschema.Draft202012Validator(json.load(open(sys.argv[3]))).validate(diff)
memory = diff["memory"]
assert memory["scheme"] == "dhelix" and not memory["mismatches"], memory["mismatches"]
assert [r["rank"] for r in memory["ranks"]] == list(range(ranks))
for r in memory["ranks"]:
    terms = {t["term"]: t for t in r["terms"]}
    for name in ("weights", "gradients", "optimizer states"):
        t = terms[name]
        assert t["parameters_match"] and t["measured_parameters"] == t["predicted_parameters"] > 0, t
    assert terms["weights"]["error_pct"] == 0 and terms["gradients"]["error_pct"] == 0, terms
    assert terms["optimizer states"]["error_pct"] == -33.33, terms["optimizer states"]
    assert (terms["optimizer states"]["predicted_bytes_per_parameter"],
            terms["optimizer states"]["measured_bytes_per_parameter"]) == (12, 8)
    assert terms["activations (arena)"]["predicted_bytes"] > 0
print(f"memory diff: {ranks} ranks, parameters equal the plan's")
PY
}

# 1. Complete traces, both schedules.
for case in "tiny-tp2-pp2 4 co-executed" "tiny-tp2 2 sequential"; do
  read -r plan ranks mode <<<"$case"
  flags=()
  [[ $mode == sequential ]] && flags=(--sequential)
  trace=$work/$plan.$mode.json
  if ! mpirun -np "$ranks" "$bin/dhelix-run" --plan "$plans/$plan.json" \
    --data "$src/examples/data/corpus.txt" --steps 2 --no-progress --trace "$trace" \
    "${flags[@]}" >"$work/out" 2>&1; then
    fail "dhelix-run $plan --trace"
    cat "$work/out"
    continue
  fi
  check_trace "$plans/$plan.json" "$trace" 2 "$mode" || fail "$plan $mode trace incomplete"
  check_memory "$trace" "$work/out" 2 || fail "$plan $mode: memory not reported or traced"

  # 2. Predicted vs measured on it.
  if ! "$bin/dhelix-diff" "$plans/$plan.json" --measured "$trace" >"$work/diff.txt"; then
    fail "dhelix-diff --measured $plan ($mode)"
  fi
  grep -q "^iteration  *[0-9.]*  *[0-9.]*  *[-+][0-9.]* %" "$work/diff.txt" ||
    fail "no iteration row in dhelix-diff --measured ($mode)"
  grep -q "^gemm " "$work/diff.txt" || fail "no gemm row in dhelix-diff --measured ($mode)"
  "$bin/dhelix-diff" --json "$plans/$plan.json" --measured "$trace" >"$work/diff.json"
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["iteration"]["measured_us"] > 0 and d["op_kinds"]' \
    "$work/diff.json" || fail "dhelix-diff --measured --json ($mode)"
  grep -q "^memory per rank: the plan's dhelix stage memory" "$work/diff.txt" ||
    fail "no memory section in dhelix-diff --measured ($mode)"
  grep -q "^optimizer states .* -33\.3 % .* \([0-9]*\) = \1 .* 12 / 8 " "$work/diff.txt" ||
    fail "no optimizer states row with equal parameters in dhelix-diff --measured ($mode)"
  check_memory_diff "$work/diff.json" "$ranks" "$src/schemas/measured-diff.schema.json" ||
    fail "dhelix-diff --measured memory ($mode)"
  python3 - "$trace" "$work/fewer.json" <<'PY'
import json, sys
trace = json.load(open(sys.argv[1]))
trace["otherData"]["memory"][0]["weight_bytes"] -= 4 * 64  # a norm's parameters fewer
json.dump(trace, open(sys.argv[2], "w"))
PY
  status=0
  "$bin/dhelix-diff" "$plans/$plan.json" --measured "$work/fewer.json" >/dev/null 2>"$work/err" ||
    status=$?
  [[ $status == 1 ]] && grep -q "failed: measured memory: rank 0 (stage 0): weights: .* hold [0-9]* parameters, but the plan's stage 0 has" "$work/err" ||
    fail "a parameter count off the plan's exited $status: $(cat "$work/err")"
  status=0
  "$bin/dhelix-diff" "$plans/$plan.json" --measured "$trace" --fail-if-off 0 >/dev/null \
    2>"$work/err" || status=$?
  [[ $status == 1 ]] && grep -q "off the predicted" "$work/err" ||
    fail "--fail-if-off 0 exited $status: $(cat "$work/err")"
  "$bin/dhelix-diff" "$plans/$plan.json" --measured "$trace" --fail-if-off 1e9 >/dev/null ||
    fail "--fail-if-off 1e9 failed"
done

# The checked-in pair, against its expected output (text byte for byte, JSON by content).
cd "$src"
pair=tests/e2e/data/measured
"$bin/dhelix-diff" $pair/tiny-tp2.plan.json --measured $pair/tiny-tp2.trace.json >"$work/pair.txt"
cmp -s "$work/pair.txt" $pair/tiny-tp2.expected.txt || {
  fail "dhelix-diff --measured on the checked-in pair differs from $pair/tiny-tp2.expected.txt"
  diff $pair/tiny-tp2.expected.txt "$work/pair.txt" || true
}
"$bin/dhelix-diff" --json $pair/tiny-tp2.plan.json --measured $pair/tiny-tp2.trace.json |
  python3 -c '
import json, sys
got = json.load(sys.stdin); got.pop("provenance")
sys.exit(0 if got == json.load(open(sys.argv[1])) else 1)' $pair/tiny-tp2.expected.json ||
  fail "dhelix-diff --measured --json differs from $pair/tiny-tp2.expected.json"
/usr/bin/python3 -c '
import json, sys
import jsonschema
jsonschema.Draft202012Validator(json.load(open(sys.argv[2]))).validate(json.load(open(sys.argv[1])))' \
  $pair/tiny-tp2.expected.json schemas/measured-diff.schema.json ||
  fail "$pair/tiny-tp2.expected.json does not match schemas/measured-diff.schema.json"

# 3. A profile from the traces, and a plan from it.
tp2_job=examples/jobs/tiny-tp2.json
mpirun -np 2 "$bin/dhelix-run" --plan "$plans/tiny-tp2.json" --data examples/data/corpus.txt \
  --steps 2 --no-progress --trace "$work/tiny-tp2.co-executed.json" >/dev/null 2>&1 ||
  fail "co-executed tiny-tp2 --trace"
mpirun -np 2 "$bin/dhelix-profile" --backend cpu --samples 3 --warmup 1 $tp2_job \
  -o "$work/base.json" >/dev/null 2>&1 || fail "dhelix-profile --backend cpu"
traces=("$work/tiny-tp2.sequential.json" "$work/tiny-tp2.co-executed.json")
if "$bin/dhelix-profile" $tp2_job --from-trace "${traces[@]}" -o "$work/nobase.json" \
  >"$work/out" 2>&1; then
  fail "--from-trace without --base succeeded although the traces lack the intra-batch ops"
else
  grep -q "give --base PROFILE" "$work/out" || fail "--from-trace without --base: $(cat "$work/out")"
fi
if "$bin/dhelix-profile" $tp2_job --from-trace "${traces[@]}" --base "$work/base.json" \
  -o "$work/traced.json" >"$work/out" 2>&1; then
  "$bin/dhelix-plan" $tp2_job --profile "$work/traced.json" -o "$work/replanned.json" \
    >/dev/null 2>&1 || fail "the profile made from traces does not plan"
  python3 - "$work/traced.json" "$work/tiny-tp2.sequential.json" <<'PY' || fail "--from-trace solo times"
import json, statistics, sys
profile, trace = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
durations = [e["dur"] for e in trace["traceEvents"] if e.get("name") == "fwd.flash_attn"]
op = next(o for o in profile["ops"] if o["example_op_id"] == "fwd.flash_attn")
assert op["samples"] == len(durations), (op["samples"], len(durations))
assert abs(op["time_us"]["median"] - statistics.median(durations)) < 1e-3, op["time_us"]
assert profile["meta"]["from_trace"]["pairs"] > 0, profile["meta"]["from_trace"]
print("from-trace:", profile["meta"]["from_trace"])
PY
else
  fail "dhelix-profile --from-trace: $(cat "$work/out")"
fi

# 4. The CPU backend's settings change the speed, never the bits.
for flags in "--comm-wait backoff --comm-max-sleep-us 5" "--comm-wait spin --pin-compute"; do
  read -r -a extra <<<"$flags"
  mpirun -np 2 "$bin/dhelix-run" --plan "$plans/tiny-tp2.json" --data examples/data/corpus.txt \
    --steps 2 --no-progress --loss-log "$work/loss ${extra[1]}.log" "${extra[@]}" >"$work/out" 2>&1 ||
    { fail "dhelix-run $flags"; cat "$work/out"; }
done
cmp -s "$work/loss backoff.log" "$work/loss spin.log" ||
  fail "--comm-wait spin --pin-compute changed the losses (against backoff, 5 us sleeps)"

# 5. Bad input.
expect_error() { # expect_error FRAGMENT COMMAND...
  local fragment=$1
  shift
  if "$@" >"$work/out" 2>&1; then
    fail "$* succeeded; expected: $fragment"
  elif ! grep -qF -- "$fragment" "$work/out"; then
    fail "$*: message lacks '$fragment':"
    cat "$work/out"
  fi
}
expect_error "--comm-max-sleep-us sets the sleeps of --comm-wait backoff; --comm-wait spin does not sleep" \
  mpirun -np 2 "$bin/dhelix-run" --plan "$plans/tiny-tp2.json" --data examples/data/corpus.txt \
  --steps 1 --comm-wait spin --comm-max-sleep-us 20
expect_error "--trace measures one schedule and --verify runs two" \
  mpirun -np 2 "$bin/dhelix-run" --plan "$plans/tiny-tp2.json" --data examples/data/corpus.txt \
  --steps 1 --verify --trace "$work/never.json"
[[ -e $work/never.json ]] && fail "a trace was written despite the error"
expect_error "--trace $work/no/such/t.json: its folder $work/no/such does not exist" \
  mpirun -np 2 "$bin/dhelix-run" --plan "$plans/tiny-tp2.json" --data examples/data/corpus.txt \
  --steps 1 --trace "$work/no/such/t.json"
cp "$plans/tiny-tp2.json" "$work/plan-copy.json"  # a copy: a failure here must not harm the source
expect_error "is the file of --plan" \
  mpirun -np 2 "$bin/dhelix-run" --plan "$work/plan-copy.json" --data examples/data/corpus.txt \
  --steps 1 --trace "$work/plan-copy.json"
cmp -s "$plans/tiny-tp2.json" "$work/plan-copy.json" || fail "--trace overwrote the plan"
"$bin/dhelix-plan" examples/jobs/tiny-tp2.json --trace "$work/predicted.json" -o "$work/p.json" >/dev/null
expect_error "not a dhelix-run --trace timeline" \
  "$bin/dhelix-diff" $pair/tiny-tp2.plan.json --measured "$work/predicted.json"
expect_error "but the plan is for job \"tiny-tp2\"" \
  "$bin/dhelix-diff" $pair/tiny-tp2.plan.json --measured "$work/tiny-tp2-pp2.co-executed.json"
expect_error "--fail-if-off needs --measured" \
  "$bin/dhelix-diff" $pair/tiny-tp2.plan.json $pair/tiny-tp2.plan.json --fail-if-off 5

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "trace test: all passed"
