#!/usr/bin/env python3
"""What one benchmark case measured (tests/bench/coexec/emulated.sh), from the raw files in
DIR: plan.json, and for each round R {co-executed,sequential}.R.trace.json and .R.diff.json
(dhelix-diff --json --measured). Prints one JSON object; every figure is the median over
rounds of the round's figure below, unless said otherwise:

  comm_share     collectives' time over the sequential iteration (rank 0, median over steps)
  co_ms, seq_ms  the measured execution of the program: median over steps of the slowest
                 rank's "iteration" slice (gradient sums and optimizer, alike in both, left out)
  speedup        median over rounds of the round's seq_ms / co_ms (the two ran one after the
                 other)
  pred_co_ms, pred_seq_ms, err_co_pct, err_seq_pct
                 dhelix-diff's predicted iteration and the error of co_ms and seq_ms against it
  pred_gain      pred_seq_ms / pred_co_ms
  {co,seq}_compute_excess_ms, err_{co,seq}_repriced_pct
                 measured minus predicted compute per iteration (dhelix-diff's op kinds, no
                 collectives): the host's speed in the run against the profile's; and the
                 error against the prediction plus that excess (what the schedule and the
                 communication miss by)
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
                 (sums per iteration) and the error, of the round with the median co_ms
  rounds         per round: co_ms, seq_ms, speedup, and co_late, seq_late: rank 0's calls
                 that returned more than 100 us after their emulated link was done, and their
                 lateness summed in ms (null unshaped)
"""
import glob
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


def late_returns(trace):
    """Rank 0's calls that returned after their emulated link was done (dhelix-run's
    runtime/comm/emulated_link.h, "Late returns"): [late calls, ms in all], None unshaped."""
    links = trace.get("otherData", {}).get("link_emulation", {}).get("rank0_returns")
    if not links:
        return None
    return [sum(l["late"] for l in links.values()), sum(l["late_ms"] for l in links.values())]


COLLECTIVES = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv"}


def compute_excess_ms(diff):
    """Measured minus predicted compute time per iteration (dhelix-diff's op kinds other than
    collectives, those with a prediction), ms: how much the host computed slower (> 0) or
    faster than the profile had it."""
    kinds = [k for k in diff["op_kinds"] if k["name"] not in COLLECTIVES
             and k["predicted_us"] is not None and k["measured_us"] is not None]
    return sum(k["measured_us"] - k["predicted_us"] for k in kinds) / 1e3


def one_round(d, r):
    co = json.load(open(f"{d}/co-executed.{r}.trace.json"))
    seq = json.load(open(f"{d}/sequential.{r}.trace.json"))
    diffs = {name: json.load(open(f"{d}/{name}.{r}.diff.json"))
             for name in ("co-executed", "sequential")}
    seq0 = rank0(seq)
    result = {
        "comm_share": seq0["collectives_ms"] / seq0["iteration_ms"],
        "co_ms": iteration_ms(co),
        "seq_ms": iteration_ms(seq),
        "pred_co_ms": diffs["co-executed"]["iteration"]["predicted_us"] / 1e3,
        "pred_seq_ms": diffs["sequential"]["iteration"]["predicted_us"] / 1e3,
        "hidden_ms": hidden_ms(co),
        "co_late": late_returns(co),
        "seq_late": late_returns(seq),
    }
    result["speedup"] = result["seq_ms"] / result["co_ms"]
    result["co_compute_excess_ms"] = compute_excess_ms(diffs["co-executed"])
    result["seq_compute_excess_ms"] = compute_excess_ms(diffs["sequential"])
    result.update({f"co_{k}": v for k, v in rank0(co).items()})
    result.update({f"seq_{k}": v for k, v in seq0.items()})
    result["op_kinds"] = {
        name: {k["name"]: [k["predicted_us"], k["measured_us"], k["error_pct"]]
               for k in diff["op_kinds"]}
        for name, diff in diffs.items()}
    return result


def main(d):
    plan = json.load(open(f"{d}/plan.json"))
    dhelix = next(s for s in plan["schemes"] if s["scheme"] == "dhelix")
    plan_hidden = sum(c["hidden_us"] for c in dhelix["comm"].values()) / 1e3
    rounds = sorted(int(p.split(".")[-3]) for p in glob.glob(f"{d}/co-executed.*.trace.json"))
    per_round = [one_round(d, r) for r in rounds]
    med = lambda key: statistics.median(r[key] for r in per_round)
    result = {key: med(key) for key in per_round[0]
              if isinstance(per_round[0][key], float)}
    # Co-executed and sequential ran one after the other in each round: the ratio of a
    # round's pair is the least exposed to the host's speed drifting between rounds.
    result["speedup"] = med("speedup")
    result["err_co_pct"] = round(100 * (result["co_ms"] / result["pred_co_ms"] - 1), 2)
    result["err_seq_pct"] = round(100 * (result["seq_ms"] / result["pred_seq_ms"] - 1), 2)
    result["pred_gain"] = result["pred_seq_ms"] / result["pred_co_ms"]
    # The same errors had the profile timed compute at the run's own speed: the prediction
    # plus the compute excess (exact for a sequential step, where compute is on the critical
    # path; an upper bound of the effect for a co-executed one). What is left is the
    # schedule's and the communication's share of the miss.
    for s in ("co", "seq"):
        repriced = result[f"pred_{s}_ms"] + result[f"{s}_compute_excess_ms"]
        result[f"err_{s}_repriced_pct"] = round(100 * (result[f"{s}_ms"] / repriced - 1), 2)
    result["plan_hidden_ms"] = plan_hidden
    result["hiding"] = result["hidden_ms"] / plan_hidden if plan_hidden > 0 else None
    result["rounds"] = [{k: r[k] for k in ("co_ms", "seq_ms", "speedup", "co_late", "seq_late")}
                        for r in per_round]
    # Op kinds: the round whose co-executed iteration is the median one.
    middle = sorted(per_round, key=lambda r: r["co_ms"])[len(per_round) // 2]
    result["op_kinds"] = middle["op_kinds"]
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
