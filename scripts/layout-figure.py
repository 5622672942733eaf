#!/usr/bin/env python3
"""Draws docs/images/layout.svg, the picture of docs/design.md's "Layout": the source
folders as boxes and an arrow from a folder to each folder whose headers it includes. The
arrows are read from the code (every #include "folder/..." of every .h, .cc, .cu and .cuh
outside tests/), so the picture cannot drift from it: the docs_layout test runs this
script with --check and fails when the checked-in picture differs, when a folder is not
in FOLDERS, or when the folders include each other in a cycle.

An arrow a -> c that a path a -> b -> c already implies is left out (transitive
reduction), so that the picture shows the layering rather than every include. Rows are
the longest path down to a folder that includes no other: lib/ and runtime/kernels/ at
the bottom, tools/ at the top; a row of one folder sits in the right-hand column.

    scripts/layout-figure.py OUTPUT.svg          write the picture
    scripts/layout-figure.py --check OUTPUT.svg  exit 1 when OUTPUT.svg is not what it writes,
                                                 or a path docs/design.md's "Where each
                                                 concept lives" names is missing
"""
import os
import re
import sys

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every folder of code, most specific first (a file belongs to the first that holds it).
FOLDERS = [
    "lib/plan", "lib", "planner", "emitter", "profiler/cpu", "profiler/cuda", "profiler",
    "runtime/comm", "runtime/cpu", "runtime/cuda", "runtime/exec", "runtime/kernels", "runtime/memory",
    "runtime/model", "runtime/train", "tools",
]
TOP_LEVEL = ["lib", "planner", "emitter", "profiler", "runtime", "tools"]
CODE = (".h", ".cc", ".cu", ".cuh")
BOX_W, BOX_H, GAP_X, ROW_H, MARGIN = 120, 26, 28, 64, 20


def folder_of(path):
    for folder in FOLDERS:
        if path.startswith(folder + "/"):
            return folder
    return None


def include_graph():
    """folder -> set of folders whose headers it includes."""
    edges = {folder: set() for folder in FOLDERS}
    for top in TOP_LEVEL:
        for root, _, files in os.walk(os.path.join(SOURCE, top)):
            for name in sorted(files):
                if not name.endswith(CODE):
                    continue
                path = os.path.relpath(os.path.join(root, name), SOURCE)
                here = folder_of(path)
                if here is None:
                    sys.exit(f"layout-figure.py: {path} is in no folder of FOLDERS: add its folder")
                with open(os.path.join(SOURCE, path), encoding="utf-8") as f:
                    for included in re.findall(r'#include "([^"]+)"', f.read()):
                        there = folder_of(included)
                        if there is not None and there != here:
                            edges[here].add(there)
    return edges


def rows_of(edges):
    """Longest path down to a sink, per folder; exits on a cycle."""
    depth, visiting = {}, set()

    def visit(folder):
        if folder in depth:
            return depth[folder]
        if folder in visiting:
            sys.exit(f"layout-figure.py: the folders include each other in a cycle through {folder}")
        visiting.add(folder)
        depth[folder] = 1 + max((visit(d) for d in edges[folder]), default=-1)
        visiting.discard(folder)
        return depth[folder]

    for folder in FOLDERS:
        visit(folder)
    return depth


def reduced(edges):
    """The arrows no longer path implies."""
    def reachable(start, skip):
        seen, stack = set(), [d for d in edges[start] if d != skip]
        while stack:
            folder = stack.pop()
            if folder not in seen:
                seen.add(folder)
                stack.extend(edges[folder])
        return seen

    return {a: {b for b in edges[a] if b not in reachable(a, b)} for a in edges}


def svg(edges):
    depth = rows_of(edges)
    arrows = reduced(edges)
    rows = max(depth.values()) + 1
    by_row = [sorted(f for f in FOLDERS if depth[f] == r) for r in range(rows)]
    widest = max(len(r) for r in by_row)
    width = 2 * MARGIN + widest * BOX_W + (widest - 1) * GAP_X
    height = 2 * MARGIN + rows * ROW_H + 30
    at = {}
    for r, folders in enumerate(by_row):
        # A row of one folder sits in the right-hand column, so that the long arrows from
        # the rows above it run beside it rather than through it.
        row_w = len(folders) * BOX_W + (len(folders) - 1) * GAP_X
        left = width - MARGIN - BOX_W if len(folders) == 1 else (width - row_w) / 2
        for i, folder in enumerate(folders):
            x = left + i * (BOX_W + GAP_X)
            y = MARGIN + (rows - 1 - r) * ROW_H
            at[folder] = (x, y)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        'font-family="sans-serif" font-size="12">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>',
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="white"/>',
    ]
    for a in FOLDERS:
        for b in sorted(arrows[a]):
            (xa, ya), (xb, yb) = at[a], at[b]
            out.append(f'<line x1="{xa + BOX_W / 2:.1f}" y1="{ya + BOX_H:.1f}" '
                       f'x2="{xb + BOX_W / 2:.1f}" y2="{yb:.1f}" stroke="#555" '
                       'stroke-width="1.2" marker-end="url(#arrow)"/>')
    for folder in FOLDERS:
        x, y = at[folder]
        out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{BOX_W}" height="{BOX_H}" rx="4" '
                   'fill="#e8eef7" stroke="#3b5b8c"/>')
        out.append(f'<text x="{x + BOX_W / 2:.1f}" y="{y + 17:.1f}" '
                   f'text-anchor="middle">{folder}/</text>')
    out.append(f'<text x="{MARGIN}" y="{height - MARGIN + 4:.0f}" fill="#555">a -&gt; b: a '
               'includes headers of b (arrows implied by a longer path left out)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def missing_table_paths():
    """Paths the "Where each concept lives" table of docs/design.md names that do not exist."""
    with open(os.path.join(SOURCE, "docs", "design.md"), encoding="utf-8") as f:
        text = f.read()
    table = text.split("### Where each concept lives", 1)[-1].split("\n## ", 1)[0]
    paths = re.findall(r"`([A-Za-z_]+/[A-Za-z0-9_/.]+)`", table)
    if not paths:
        return ["docs/design.md: no \"Where each concept lives\" table with paths"]
    return [f"docs/design.md names {p}, which does not exist" for p in paths
            if not os.path.exists(os.path.join(SOURCE, p))]


def main():
    args = sys.argv[1:]
    check = args[:1] == ["--check"]
    if check:
        args = args[1:]
    if len(args) != 1:
        sys.exit(__doc__)
    picture = svg(include_graph())
    if check:
        problems = missing_table_paths()
        with open(args[0], encoding="utf-8") as f:
            if f.read() != picture:
                problems.append(f"{args[0]} is stale: run scripts/regenerate-pictures.sh")
        if problems:
            sys.exit("\n".join(problems))
        return
    with open(args[0], "w", encoding="utf-8") as f:
        f.write(picture)


if __name__ == "__main__":
    main()
