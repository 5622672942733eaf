#!/usr/bin/env python3
"""Turns a plan's lone backward tasks into split ones (plan schema 1.3.0, docs/plan.md
"Split backward"): each task of kind backward becomes its input part I ("I<mb><chunk>",
backward.work "input") where it was, and its weight part W ("W<mb><chunk>", "weight")
follows DEFER tasks of the original list later (at the stage's end when fewer are left).
Task indices are renumbered and every stage's waits_for follows them; a W waits for no
other stage. The same as tests/plan/split_backward.h, on a file.

Usage: split_backward.py IN.json OUT.json [DEFER]   (DEFER: default 2)
"""
import copy
import json
import sys


def split(plan, defer):
    plan["schema_version"] = "1.3.0"
    renumbered = []
    for stage in plan["stages"]:
        tasks = stage["tasks"]
        last = len(tasks) - 1
        pending = {}  # original index -> W tasks to insert after it
        for task in tasks:
            part = task["backward"]
            if task["kind"] != "backward" or part is None or part.get("work", "whole") != "whole":
                continue
            weight = copy.deepcopy(task)
            suffix = task["label"][1:]
            task["label"] = "I" + suffix
            part["work"] = "input"
            weight["label"] = "W" + suffix
            weight["backward"]["work"] = "weight"
            weight["waits_for"] = []
            weight["start_us"] = weight["end_us"]
            pending.setdefault(min(task["index"] + defer, last), []).append(weight)
        out, mapping = [], {}
        for task in tasks:
            mapping[task["index"]] = len(out)
            out.append(task)
            out.extend(pending.get(task["index"], []))
        for i, task in enumerate(out):
            task["index"] = i
        stage["tasks"] = out
        renumbered.append(mapping)
    for stage in plan["stages"]:
        for task in stage["tasks"]:
            for ref in task["waits_for"]:
                ref["task"] = renumbered[ref["stage"]][ref["task"]]
    return plan


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    plan = json.load(open(sys.argv[1]))
    defer = int(sys.argv[3]) if len(sys.argv) == 4 else 2
    json.dump(split(plan, defer), open(sys.argv[2], "w"), indent=2)


if __name__ == "__main__":
    main()
