#!/usr/bin/env python3
"""The DHelix paper's Table 7 on a plan: how the TP communication of the chosen window's
blocks splits into hidden, slowdown, launch interval and uncovered time, in % of their sum
(docs/cost-model.md, "Table 7 on the model").

    table7-decomposition.py PLAN.json [PLAN.json ...]
    table7-decomposition.py --check docs/cost-model.md PLAN.json [PLAN.json ...]

With --check it exits 1 unless the document's table row for each plan's TP size shows these
figures and the plan's hidden share, to one decimal (tests/e2e/table7_test.sh).

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


def hidden_share(plan):
    """The plan's own TP hidden share for the dhelix scheme, % (validation rows 33-35)."""
    scheme = next(s for s in plan["schemes"] if s["scheme"] == "dhelix")
    tp = scheme["comm"]["tp"]
    return 100 * tp["hidden_us"] / (tp["hidden_us"] + tp["exposed_us"])


def documented_rows(doc):
    """The model's figures in the document's Table 7 rows, by TP size."""
    rows = {}
    for line in open(doc, encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].isdigit():
            rows[int(cells[0])] = [float(c.split()[0]) for c in cells[1:]]
    return rows


def main():
    args = sys.argv[1:]
    doc = None
    if args[:1] == ["--check"]:
        doc, args = args[1], args[2:]
    problems = []
    for path in args:
        plan = json.load(open(path))
        shares = decompose(plan)
        figures = [shares[k] for k in ("hidden", "slowdown", "launch", "uncovered")]
        figures.append(hidden_share(plan))
        print(f"{path}: " + ", ".join(f"{k} {v:.1f} %" for k, v in shares.items()) +
              f"; plan's hidden share {figures[-1]:.1f} %")
        if doc is None:
            continue
        tp = plan["job"]["parallel"]["tp"]
        row = documented_rows(doc).get(tp)
        shown = [float(f"{v:.1f}") for v in figures]
        if row != shown:
            problems.append(f"{doc}: the TP {tp} row shows {row}, the plan gives {shown}")
    for problem in problems:
        print(problem, file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
