#!/usr/bin/env python3
"""The DHelix paper's Table 7 on a plan: how the TP communication of the chosen window's
blocks splits into hidden, slowdown, launch interval and uncovered time, in % of their sum
(docs/cost-model.md, "Table 7 on the model").

    table7-decomposition.py PLAN.json [PLAN.json ...]

Per block of `window_blocks` (pairing 0): a TP collective's wall time covered by a compute
kernel is hidden; a kernel's time beyond its solo time moves from hidden to slowdown, split
over the collectives beside it by overlap; the time before a paired block's first op (the
host's launch interval) is launch, split over the block's collectives by their wall time; the
rest of a collective's wall time, with no kernel beside it, is uncovered.
"""
import json
import sys

COLLECTIVES = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"}


def overlap(a0, a1, b0, b1):
    return max(0.0, min(a1, b1) - max(a0, b0))


def covered(start, finish, intervals):
    """Length of [start, finish] covered by the union of intervals."""
    total, cursor = 0.0, start
    for s, f in sorted(intervals):
        s, f = max(s, cursor), min(f, finish)
        if f > s:
            total += f - s
            cursor = f
    return total


def decompose(plan):
    pairing = plan["pairings"][0]
    records = {r["id"]: r for r in pairing["forward_ops"] + pairing["backward_ops"]}
    sums = {"hidden": 0.0, "slowdown": 0.0, "launch": 0.0, "uncovered": 0.0}
    for block in pairing["window_blocks"]:
        ops = []
        for t in block["timings"]:
            record = records[t["op"].split(".", 1)[1]]  # drop the "L<k>." layer prefix
            ops.append((t["start_us"], t["finish_us"], record))
        tp = [(s, f) for s, f, r in ops if r["kind"] in COLLECTIVES and r["group"] == "tp"]
        if not tp:
            continue
        kernels = [(s, f, r) for s, f, r in ops if r["stream"] == "compute"]
        slowdown = [0.0] * len(tp)
        for s, f, r in kernels:
            excess = (f - s) - r["solo_us"]
            beside = [overlap(s, f, cs, cf) for cs, cf in tp]
            if excess > 1e-9 and sum(beside) > 0:
                for i, o in enumerate(beside):
                    slowdown[i] += excess * o / sum(beside)
        walls = [f - s for s, f in tp]
        if block["forward_ops"] and block["backward_ops"]:
            first = min(s for s, _, _ in ops)
            for w in walls:
                sums["launch"] += first * w / sum(walls)
        for i, (s, f) in enumerate(tp):
            cover = covered(s, f, [(ks, kf) for ks, kf, _ in kernels])
            sums["hidden"] += cover - slowdown[i]
            sums["slowdown"] += slowdown[i]
            sums["uncovered"] += walls[i] - cover
    total = sum(sums.values())
    return {k: 100 * v / total for k, v in sums.items()}


def main():
    for path in sys.argv[1:]:
        shares = decompose(json.load(open(path)))
        print(f"{path}: " + ", ".join(f"{k} {v:.1f} %" for k, v in shares.items()))


if __name__ == "__main__":
    main()
