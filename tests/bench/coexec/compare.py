#!/usr/bin/env python3
"""What one benchmark case measured (tests/bench/coexec/emulated.sh), from the raw files in
DIR: plan.json, {co-executed,sequential}.trace.json and .diff.json (dhelix-diff --json
--measured). Prints one JSON object:

  comm_share     collectives' time over the sequential iteration (rank 0, median over steps)
  co_ms, seq_ms  the measured execution of the program: median over steps of the slowest
                 rank's "iteration" slice (gradient sums and optimizer, alike in both, left out)
  speedup        seq_ms / co_ms
  pred_co_ms, pred_seq_ms, err_co_pct, err_seq_pct
                 dhelix-diff's predicted iteration and its error against the measured one
  pred_gain      pred_seq_ms / pred_co_ms
  hidden_ms, plan_hidden_ms, hiding
                 communication hidden: in the co-executed trace, per rank and step, the time of
                 each collective that some compute op of the same rank overlaps (the planner's
                 definition, planner/layer_costs.cc), averaged over ranks, median over steps;
                 in the plan, the dhelix scheme's hidden communication per GPU and iteration;
                 hiding = measured / planned
  {co,seq}_compute_ms, _collectives_ms, _waiting_ms, _iteration_ms
                 where the time goes (rank 0, median over steps): compute ops, collectives,
                 the compute thread waiting, the program's execution
  op_kinds       per schedule, dhelix-diff's predicted and measured time per op kind
                 (sums per iteration) and the error
"""
import json
import statistics
import sys


def slices(trace):
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


def merged(intervals):
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def covered(span, intervals):
    return sum(max(0.0, min(span[1], b) - max(span[0], a)) for a, b in intervals)


def iteration_ms(trace):
    steps = {}
    for e in slices(trace):
        if e["name"] == "iteration":
            step = e["args"]["step"]
            steps[step] = max(steps.get(step, 0), e["dur"])
    return statistics.median(steps.values()) / 1e3


def per_rank_step(trace):
    """{(rank, step): {"compute": [(s, e)], "collective": [(s, e)], "iteration": us, "wait": us}}"""
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    out = {}
    for e in slices(trace):
        step = e["args"].get("step")
        if step is None:
            continue
        row = out.setdefault((e["pid"], step),
                             {"compute": [], "collective": [], "iteration": 0.0, "wait": 0.0})
        kind = e["args"].get("kind")
        if kind in ("compute", "collective"):
            row[kind].append((e["ts"], e["ts"] + e["dur"]))
        elif e["name"] == "iteration":
            row["iteration"] += e["dur"]
        elif e["name"] == "wait" and threads.get((e["pid"], e["tid"])) == "compute":
            row["wait"] += e["dur"]
    return out


def hidden_ms(trace):
    rows = per_rank_step(trace)
    by_step = {}
    for (rank, step), row in rows.items():
        busy = merged(row["compute"])
        hidden = sum(covered(c, busy) for c in row["collective"])
        by_step.setdefault(step, []).append(hidden)
    return statistics.median(statistics.mean(v) for v in by_step.values()) / 1e3


def rank0(trace):
    rows = [row for (rank, _), row in per_rank_step(trace).items() if rank == 0]
    med = lambda f: statistics.median(f(r) for r in rows) / 1e3
    return {
        "compute_ms": med(lambda r: sum(b - a for a, b in r["compute"])),
        "collectives_ms": med(lambda r: sum(b - a for a, b in r["collective"])),
        "waiting_ms": med(lambda r: r["wait"]),
        "iteration_ms": med(lambda r: r["iteration"]),
    }


def main(d):
    co = json.load(open(f"{d}/co-executed.trace.json"))
    seq = json.load(open(f"{d}/sequential.trace.json"))
    co_diff = json.load(open(f"{d}/co-executed.diff.json"))["iteration"]
    seq_diff = json.load(open(f"{d}/sequential.diff.json"))["iteration"]
    plan = json.load(open(f"{d}/plan.json"))
    dhelix = next(s for s in plan["schemes"] if s["scheme"] == "dhelix")
    plan_hidden = sum(c["hidden_us"] for c in dhelix["comm"].values()) / 1e3
    seq0 = rank0(seq)
    result = {
        "comm_share": seq0["collectives_ms"] / seq0["iteration_ms"],
        "co_ms": iteration_ms(co),
        "seq_ms": iteration_ms(seq),
        "pred_co_ms": co_diff["predicted_us"] / 1e3,
        "pred_seq_ms": seq_diff["predicted_us"] / 1e3,
        "err_co_pct": co_diff["error_pct"],
        "err_seq_pct": seq_diff["error_pct"],
        "hidden_ms": hidden_ms(co),
        "plan_hidden_ms": plan_hidden,
    }
    result["speedup"] = result["seq_ms"] / result["co_ms"]
    result["pred_gain"] = result["pred_seq_ms"] / result["pred_co_ms"]
    result["hiding"] = result["hidden_ms"] / plan_hidden if plan_hidden > 0 else None
    result.update({f"co_{k}": v for k, v in rank0(co).items()})
    result.update({f"seq_{k}": v for k, v in seq0.items()})
    result["op_kinds"] = {
        name: {k["name"]: [k["predicted_us"], k["measured_us"], k["error_pct"]]
               for k in json.load(open(f"{d}/{name}.diff.json"))["op_kinds"]}
        for name in ("co-executed", "sequential")}
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
