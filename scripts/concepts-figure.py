#!/usr/bin/env python3
"""Draws docs/images/concepts.svg, the picture of docs/concepts.md: one SI block task
(F2d+B0u, pp = 2) on one GPU, cut into three pairing blocks. Each row is a stream; the
forward strand's ops are green, the backward strand's orange; a dashed line is a block
barrier. The layout is illustrative (op lengths are not measured), so the picture is
written here rather than by dhelix-plan. Deterministic: scripts/regenerate-pictures.sh
rewrites it and the docs_pictures test fails when the checked-in file differs.

    scripts/concepts-figure.py OUTPUT.svg
"""
import sys

FWD, BWD = "#4caf50", "#ff9800"
ROWS = ["compute", "local comm (TP)", "cross-node comm (DP)"]
# (row, start, length, strand, label) in arbitrary time units; three blocks of 10, 9, 8.
OPS = [
    (0, 0.0, 6.0, BWD, "B0u fc2 dgrad"),
    (1, 0.5, 5.0, FWD, "F2d all-gather"),
    (0, 6.0, 3.5, FWD, "F2d qkv"),
    (0, 10.0, 5.5, FWD, "F2d attention"),
    (1, 10.0, 5.5, BWD, "B0u reduce-scatter"),
    (0, 15.5, 3.0, BWD, "B0u wgrad"),
    (0, 19.0, 6.5, BWD, "B0u attn bwd"),
    (1, 19.0, 5.5, FWD, "F2d reduce-scatter"),
    (2, 19.0, 7.0, BWD, "B0u grad all-reduce"),
]
BLOCKS = [0.0, 10.0, 19.0, 27.0]
SCALE, LEFT, TOP, ROW_H = 22.0, 150.0, 58.0, 34.0


def esc(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def main():
    width = LEFT + BLOCKS[-1] * SCALE + 20
    height = TOP + len(ROWS) * ROW_H + 70
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="white"/>',
        '<text x="10" y="20" font-size="13" font-weight="bold">SI block task F2d+B0u on one '
        "GPU (pp = 2: forward of micro-batch j = 2 beside backward of j - pp = 0)</text>",
    ]
    for i, name in enumerate(ROWS):
        y = TOP + i * ROW_H
        out.append(f'<text x="10" y="{y + 20:.0f}">{esc(name)}</text>')
        out.append(f'<line x1="{LEFT:.0f}" y1="{y + ROW_H - 2:.0f}" x2="{width - 20:.0f}" '
                   f'y2="{y + ROW_H - 2:.0f}" stroke="#ddd"/>')
    for k in range(len(BLOCKS) - 1):
        x0 = LEFT + BLOCKS[k] * SCALE
        x1 = LEFT + BLOCKS[k + 1] * SCALE
        out.append(f'<text x="{(x0 + x1) / 2:.0f}" y="{TOP - 8:.0f}" text-anchor="middle">'
                   f"pairing block {k}</text>")
    for x in BLOCKS:
        px = LEFT + x * SCALE
        out.append(f'<line x1="{px:.1f}" y1="{TOP - 4:.0f}" x2="{px:.1f}" '
                   f'y2="{TOP + len(ROWS) * ROW_H:.0f}" stroke="#555" stroke-dasharray="4,3"/>')
    for row, start, length, colour, label in OPS:
        x = LEFT + start * SCALE
        y = TOP + row * ROW_H + 4
        w = length * SCALE
        out.append(f'<g><title>{esc(label)}</title><rect x="{x:.1f}" y="{y:.0f}" '
                   f'width="{w:.1f}" height="{ROW_H - 10:.0f}" fill="{colour}" rx="3"/>'
                   f'<text x="{x + w / 2:.1f}" y="{y + 16:.0f}" text-anchor="middle">'
                   f"{esc(label)}</text></g>")
    legend_y = TOP + len(ROWS) * ROW_H + 25
    out.append(f'<rect x="10" y="{legend_y - 10:.0f}" width="12" height="12" fill="{FWD}"/>')
    out.append(f'<text x="28" y="{legend_y:.0f}">forward strand (micro-batch 2, down chunk)'
               "</text>")
    out.append(f'<rect x="300" y="{legend_y - 10:.0f}" width="12" height="12" fill="{BWD}"/>')
    out.append(f'<text x="318" y="{legend_y:.0f}">backward strand (micro-batch 0, up chunk)'
               "</text>")
    out.append(f'<text x="10" y="{legend_y + 22:.0f}">Dashed lines: block barriers. Each '
               "strand's communication runs under the other strand's computation.</text>")
    out.append("</svg>")
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
