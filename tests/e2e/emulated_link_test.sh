#!/usr/bin/env bash
# dhelix-run and dhelix-profile --backend cpu on emulated links (--emulate-link,
# runtime/comm/emulated_link.h) under mpirun:
#   1. --verify passes bit for bit under --jitter-us on emulated links on TP 2 x PP 2
#      (pipeline transfers on the pp link), CP 2 x TP 2 (the K/V ring), MoE EP 2 (the
#      all-to-alls) and DP 2 x TP 2 (the gradient buckets, overlapped, on the dp link), and
#      the losses equal those of the same run on the real transport;
#   2. a run says it ran on an emulated link: in its summary line and in its trace's
#      otherData.link_emulation, each with rank 0's calls and how many returned late
#      (emulated_link.h, "Late returns"); a step on a slow emulated link takes longer than
#      the modelled wire time of its collectives (the link is really in the way);
#   3. a cpu profile measured on an emulated link records it (meta.measurement.link_emulation),
#      times its collectives no faster than the link's wire time, and plans; it timed its
#      GEMMs on cold operands (meta.measurement.cold_operand_bytes, profiler/cpu/
#      cold_operands.h), and on hot ones with --warm-caches;
#   4. bad input: a bad value names the flag, the value and the rule (exit 2); the cuda
#      backend and the model backend refuse the flag by name.
# Usage: emulated_link_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=${1:?usage: emulated_link_test.sh BIN_DIR SOURCE_DIR}
src=${2:?usage: emulated_link_test.sh BIN_DIR SOURCE_DIR}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
corpus=$src/examples/data/corpus.txt
plans=$src/examples/plans
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
run() { # run RANKS ARGS...: dhelix-run under mpirun, output in $work/out, status in $status
  local ranks=$1
  shift
  status=0
  mpirun --oversubscribe -np "$ranks" "$bin/dhelix-run" --data "$corpus" --no-progress "$@" \
    >"$work/out" 2>&1 || status=$?
}

# 1. --verify under jitter on emulated links; the same losses as on the real transport.
for case in "tiny-tp2-pp2 4" "tiny-cp2-tp2 4" "tiny-moe-ep2 2" "tiny-dp2-tp2 4"; do
  read -r plan ranks <<<"$case"
  run "$ranks" --plan "$plans/$plan.json" --steps 2 --verify --jitter-us 100 \
    --emulate-link 1gbit@20us --loss-log "$work/$plan.emulated.log" --overlap-grad-reduce \
    --ddp-bucket-size 4096
  [[ $status == 0 ]] || { fail "$plan: --verify on an emulated link: status $status"; cat "$work/out"; }
  run "$ranks" --plan "$plans/$plan.json" --steps 2 --loss-log "$work/$plan.real.log" \
    --overlap-grad-reduce --ddp-bucket-size 4096
  [[ $status == 0 ]] || { fail "$plan: run on the real transport: status $status"; cat "$work/out"; }
  cmp -s "$work/$plan.emulated.log" "$work/$plan.real.log" ||
    fail "$plan: losses differ between the emulated link and the real transport"
done

# 2. The summary line and the trace say so; a slow link is in the way. tiny-tp2 at
#    10 Mbit/s (1.25 bytes/us): each TP all-gather or reduce-scatter of its activations
#    (S = 2 sequences x 64 tokens x hidden 64 x 4 bytes = 32 KiB) puts 1/2 S on the link:
#    50 + 16384 / 1.25 = 13157 us.
run 2 --plan "$plans/tiny-tp2.json" --steps 1 --emulate-link tp=10mbit@50us \
  --trace "$work/tp2.trace.json"
[[ $status == 0 ]] || { fail "tiny-tp2 traced on an emulated link: status $status"; cat "$work/out"; }
grep -Eq "on an emulated link \(tp 10mbit@50us; rank 0: [0-9]+ calls, (none|[0-9]+) returned more than 100 us after its link" "$work/out" ||
  { fail "the summary line does not name the emulated link"; cat "$work/out"; }
python3 - "$work/tp2.trace.json" <<'PY' || fail "trace of the emulated run"
import json, statistics, sys
trace = json.load(open(sys.argv[1]))
links = trace["otherData"].get("link_emulation")
assert links and links["tp"]["link"] == "10mbit@50us", links
assert "cp" not in links, "only the kinds asked for are emulated"
assert "not a network" in links["note"]
returns = links["rank0_returns"]
assert list(returns) == ["tp"], returns
assert returns["tp"]["calls"] > 50 and 0 <= returns["tp"]["late"] <= returns["tp"]["calls"], returns
wire = 50 + 16384 / 1.25
times = [e["dur"] for e in trace["traceEvents"]
         if e.get("ph") == "X" and e["args"].get("kind") == "collective"
         and ("allgather" in e["name"] or "reduce_scatter" in e["name"])]
assert len(times) > 100, f"{len(times)} activation collectives"
assert min(times) >= wire, f"a collective took {min(times)} us, less than the wire's {wire}"
assert statistics.median(times) <= 1.5 * wire, f"median {statistics.median(times)} us"
PY

# 3. A profile on an emulated link records it and plans.
mpirun --oversubscribe -np 2 "$bin/dhelix-profile" --backend cpu "$src/examples/jobs/tiny-tp2.json" \
  --samples 3 --warmup 1 --emulate-link 200mbit@30us -o "$work/profile.json" >"$work/out" 2>&1 ||
  { fail "dhelix-profile --emulate-link"; cat "$work/out"; }
python3 - "$work/profile.json" <<'PY' || fail "the emulated profile"
import json, sys
profile = json.load(open(sys.argv[1]))
links = profile["meta"]["measurement"]["link_emulation"]
assert links["tp"]["link"] == "200mbit@30us", links
# 200 Mbit/s = 25 bytes/us; a 2-rank all-gather or reduce-scatter of S bytes takes at
# least 30 + S / 2 / 25 us.
checked = 0
for op in profile["ops"]:
    kind, _, rest = op["signature"].partition(":")
    if kind not in ("all_gather", "reduce_scatter"):
        continue
    size = int(rest.split("bytes=")[1].split(":")[0])
    wire = 30 + size / 2 / 25
    assert op["time_us"]["min"] >= wire, (op["signature"], op["time_us"], wire)
    checked += 1
assert checked, "no collectives in the profile"
assert profile["meta"]["measurement"]["cold_operand_bytes"] > 0, profile["meta"]["measurement"]
PY
mpirun --oversubscribe -np 2 "$bin/dhelix-profile" --backend cpu "$src/examples/jobs/tiny-tp2.json" \
  --samples 1 --warmup 0 --warm-caches -o "$work/warm.json" >"$work/out" 2>&1 ||
  { fail "dhelix-profile --warm-caches"; cat "$work/out"; }
python3 -c 'import json, sys; m = json.load(open(sys.argv[1]))["meta"]["measurement"]
assert m["cold_operand_bytes"] == 0, m' "$work/warm.json" || fail "--warm-caches: cold_operand_bytes"
"$bin/dhelix-plan" "$src/examples/jobs/tiny-tp2.json" --profile "$work/profile.json" \
  -o "$work/plan.json" >"$work/out" 2>&1 || { fail "planning from the emulated profile"; cat "$work/out"; }

# 4. Bad input.
run 2 --plan "$plans/tiny-tp2.json" --steps 1 --emulate-link tp=2gb
[[ $status == 2 ]] || fail "--emulate-link tp=2gb: status $status, not 2"
grep -q "\-\-emulate-link: 'tp=2gb' has rate '2gb': write a positive number of bits per second as tc does" "$work/out" ||
  { fail "--emulate-link tp=2gb: message"; cat "$work/out"; }
run 2 --plan "$plans/tiny-tp2.json" --steps 1 --emulate-link 1gbit --backend cuda
[[ $status == 4 ]] || fail "--emulate-link with --backend cuda: status $status, not 4"
grep -q "\-\-emulate-link: the cuda backend moves its bytes over NCCL" "$work/out" ||
  { fail "--emulate-link with --backend cuda: message"; cat "$work/out"; }
status=0
"$bin/dhelix-profile" --backend model "$src/examples/jobs/tiny-tp2.json" --emulate-link 1gbit \
  -o "$work/model.json" >"$work/out" 2>&1 || status=$?
[[ $status == 2 ]] || fail "dhelix-profile --backend model --emulate-link: status $status, not 2"
grep -q "\-\-emulate-link" "$work/out" || { fail "--backend model --emulate-link: message"; cat "$work/out"; }
[[ ! -e $work/model.json ]] || fail "a refused profile wrote its output"
status=0
"$bin/dhelix-profile" --backend model "$src/examples/jobs/tiny-tp2.json" --warm-caches \
  -o "$work/model.json" >"$work/out" 2>&1 || status=$?
[[ $status == 2 ]] || fail "dhelix-profile --backend model --warm-caches: status $status, not 2"
grep -q "\-\-warm-caches" "$work/out" || { fail "--backend model --warm-caches: message"; cat "$work/out"; }

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "emulated link: all checks passed"
