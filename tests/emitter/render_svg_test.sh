#!/usr/bin/env bash
# Renders every picture dhelix writes for the example plans (and the test fixture) in headless
# Chromium and checks that each is well-formed XML and renders to an image that is not blank.
#
#   render_svg_test.sh <dhelix_emitter_tests binary> [<folder to keep the SVGs and PNGs in>]
#
# Exit 77 (CTest: skipped) when no chromium is installed (scripts/install-deps.sh installs it).
set -euo pipefail

tests_binary=$1
keep=${2:-}
chromium_bin=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chromium_bin" ]; then
  echo "render_svg_test: skipped: no chromium (Debian package 'chromium') on PATH"
  exit 77
fi
python=/usr/bin/python3

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=${keep:-$work/svg}
mkdir -p "$out"

# The SVG test writes both pictures of each plan into $DHELIX_SVG_OUT.
DHELIX_SVG_OUT=$out "$tests_binary" --gtest_filter='SvgFiles.WritesBothPicturesOfEveryExamplePlan' \
  >"$work/gtest.log" 2>&1 || { cat "$work/gtest.log"; exit 1; }

count=0
for svg in "$out"/*.svg; do
  name=$(basename "$svg" .svg)
  # Well-formed: python's own XML parser, independent of the C++ checker.
  "$python" -c 'import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == "{http://www.w3.org/2000/svg}svg", root.tag' "$svg"
  png=$out/$name.png
  # --window-size: the pictures are 1400 px wide; the height fits the tallest picture.
  timeout 120 "$chromium_bin" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --hide-scrollbars --user-data-dir="$work/profile-$name" --screenshot="$png" \
    --window-size=1400,1400 "file://$svg" >"$work/chromium-$name.log" 2>&1 || {
    cat "$work/chromium-$name.log"
    echo "render_svg_test: chromium failed on $svg"
    exit 1
  }
  # Not blank: count non-white pixels of the PNG with zlib (8-bit RGB or RGBA, as Chromium
  # writes), and require a share that only a drawn picture reaches.
  "$python" - "$png" <<'EOF'
import struct, sys, zlib

path = sys.argv[1]
data = open(path, "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, width, height, channels = 8, b"", 0, 0, 0
while pos < len(data):
    length, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + length]
    if kind == b"IHDR":
        width, height, depth, colour = struct.unpack(">IIBB", body[:10])
        assert depth == 8 and colour in (2, 6), f"unexpected PNG format {depth}/{colour}"
        channels = 3 if colour == 2 else 4
    elif kind == b"IDAT":
        idat += body
    pos += 12 + length
raw = zlib.decompress(idat)
stride = width * channels
previous = bytearray(stride)
non_white = 0
colours = set()
for y in range(height):
    start = y * (stride + 1)
    kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
    for x in range(stride):
        a = line[x - channels] if x >= channels else 0
        b = previous[x]
        c = previous[x - channels] if x >= channels else 0
        if kind == 1:
            line[x] = (line[x] + a) & 255
        elif kind == 2:
            line[x] = (line[x] + b) & 255
        elif kind == 3:
            line[x] = (line[x] + (a + b) // 2) & 255
        elif kind == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(0, stride, channels):
        pixel = bytes(line[x:x + 3])
        if pixel != b"\xff\xff\xff":
            non_white += 1
            if len(colours) < 64:
                colours.add(pixel)
    previous = line
share = non_white / (width * height)
print(f"{path}: {width}x{height}, {100 * share:.1f} % non-white, {len(colours)}+ colours")
assert share > 0.02, "the picture is blank"
assert len(colours) >= 5, "the picture has fewer than 5 colours"
EOF
  count=$((count + 1))
done
[ "$count" -ge 6 ] || { echo "render_svg_test: only $count pictures"; exit 1; }
echo "render_svg_test: $count pictures rendered"
