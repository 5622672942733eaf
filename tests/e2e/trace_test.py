#!/usr/bin/env python3
"""The Chrome trace carries every phase of the iteration, and they add up to the report.

For shipped jobs, `dhelix-plan JOB -o plan.json --trace trace.json --report json`, then:

1. per stage, the task row (tid 0) holds the tasks, then the exposed DP gradient reduction,
   the optimizer step and the exposed parameter gather; the idle gaps are the bubble. The
   slowest stage's row ends at the report's dhelix iteration time;
2. busy + idle + exposed DP + optimizer of that stage is the iteration time;
3. the exposed DP time on the task rows, summed over stages and divided by pp, is the
   report's exposed DP communication; the idle share up to the pipeline's end is its bubble;
4. communication the plan puts on cross-node links (DP reduction, pipeline sends) has
   slices on a "cross comm" row of its stage.

Tolerance: the plan and the trace round times to 1 ns (3 decimals of a microsecond), so each
sum may be off by 1 ns per term: 0.01 us for times, 1e-5 for the bubble ratio.

Usage: trace_test.py BIN_DIR SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict

TIME_TOLERANCE_US = 0.01
RATIO_TOLERANCE = 1e-5

# (job, extra flags): the README's pipeline job, one stage, CP across nodes, a CPU job, and
# the CPU job on interleaved stages (planner/dhelix_shapes.h).
JOBS = [
    ("llama-39b-a40-dp4-tp8-pp2", ["--gbs", "48"]),
    ("llama-8b-a40-dp16-tp4", []),
    ("llama-39b-a40-dp2-tp8-cp2-pp2-seq16k", []),
    ("gpt-30b-a40-dp4-tp8-pp2", []),
    ("tiny-tp2-pp2", []),
    ("tiny-tp2-pp2", ["--shape", "interleaved"]),
]


def fail(job, message):
    print(f"FAIL: {job}: {message}")
    return 1


def check_job(bin_dir, src, job, flags, work):
    plan_path = os.path.join(work, f"{job}.plan.json")
    trace_path = os.path.join(work, f"{job}.trace.json")
    out = subprocess.run(
        [os.path.join(bin_dir, "dhelix-plan"), os.path.join(src, "examples/jobs", job + ".json"),
         *flags, "-o", plan_path, "--trace", trace_path, "--report", "json"],
        check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    plan = json.load(open(plan_path))
    trace = json.load(open(trace_path))
    dhelix = next(s for s in report["schemes"] if s["scheme"] == "dhelix")
    pp = report["stages"]
    failures = 0

    threads = {}  # (pid, tid) -> name
    rows = defaultdict(list)  # (pid, tid) -> [(ts, dur, name, cat)]
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e["ph"] == "X":
            rows[(e["pid"], e["tid"])].append((e["ts"], e["dur"], e["name"], e["cat"]))

    stage_end = {}
    busy = {}
    tail = defaultdict(lambda: defaultdict(float))
    last_task_end = {}
    for pid in range(pp):
        row = sorted(rows[(pid, 0)])
        busy[pid] = sum(dur for _, dur, _, cat in row if cat == "task")
        last_task_end[pid] = max(ts + dur for ts, dur, _, cat in row if cat == "task")
        for ts, dur, name, cat in row:
            if cat == "iteration_end":
                tail[pid][name] += dur
        stage_end[pid] = max(ts + dur for ts, dur, _, _ in row)
    iteration = max(stage_end.values())
    if abs(iteration - dhelix["iteration_us"]) > TIME_TOLERANCE_US:
        failures += fail(job, f"the trace ends at {iteration} us, the report says "
                              f"{dhelix['iteration_us']} us")
    slowest = max(stage_end, key=stage_end.get)
    pipeline_end = max(last_task_end.values())
    idle = last_task_end[slowest] - busy[slowest]
    phases = busy[slowest] + idle + sum(tail[slowest].values())
    if abs(phases - dhelix["iteration_us"]) > TIME_TOLERANCE_US:
        failures += fail(job, f"stage {slowest}: busy {busy[slowest]} + idle {idle} + "
                              f"{dict(tail[slowest])} = {phases} us, not the iteration")
    if not any("optimizer step" in tail[pid] for pid in range(pp)):
        failures += fail(job, "no optimizer step in the trace")
    dp_exposed = sum(dur for pid in range(pp) for name, dur in tail[pid].items()
                     if name.startswith("dp "))
    report_dp = dhelix["comm"]["dp"]["exposed_us"]
    if abs(dp_exposed / pp - report_dp) > TIME_TOLERANCE_US:
        failures += fail(job, f"exposed DP in the trace {dp_exposed / pp} us per GPU, "
                              f"the report says {report_dp} us")
    bubble = sum(pipeline_end - busy[pid] for pid in range(pp)) / (pp * pipeline_end)
    if abs(bubble - dhelix["bubble_ratio"]) > RATIO_TOLERANCE:
        failures += fail(job, f"bubble {bubble} in the trace, {dhelix['bubble_ratio']} "
                              "in the report")

    for stage in plan["stages"]:
        pid, phases_of = stage["stage"], stage["phases"]
        dp_us = sum(phases_of[k] for k in ("dp_reduce_hidden_us", "dp_reduce_exposed_us",
                                           "dp_gather_hidden_us", "dp_gather_exposed_us"))
        for kind, time_us, stream in (("DP reduction", dp_us, phases_of["dp_stream"]),
                                      ("pipeline sends", phases_of["p2p_us"],
                                       phases_of["p2p_stream"])):
            if time_us <= 0:
                continue
            title = ("cross comm" if stream == "cross_comm" else "local comm") + ": " + kind
            filled = [tid for (p, tid), name in threads.items()
                      if p == pid and name == title and rows[(p, tid)]]
            if not filled:
                failures += fail(job, f"stage {pid}: no slices on the row '{title}'")
    cross = [name for (p, tid), name in threads.items()
             if name.startswith("cross comm") and rows[(p, tid)]]
    print(f"{job}: trace ends at {iteration:.3f} us = report {dhelix['iteration_us']:.3f} us; "
          f"stage {slowest}: busy {busy[slowest]:.0f} + idle {idle:.0f} + "
          f"{ {k: round(v) for k, v in tail[slowest].items()} }; cross-node rows with slices: "
          f"{sorted(set(cross))}")
    return failures


def main():
    bin_dir, src = sys.argv[1], sys.argv[2]
    failures = 0
    with tempfile.TemporaryDirectory() as work:
        for job, flags in JOBS:
            failures += check_job(bin_dir, src, job, flags, work)
    if failures:
        print(f"{failures} failure(s)")
        return 1
    print("trace phases: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
