#!/usr/bin/env bash
# Regenerates the tables of docs/validation.md between its "validation-table" markers from
# scripts/validation-table.sh. Usage: scripts/update-validation.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
table=$(mktemp)
page=$(mktemp)
trap 'rm -f "$table" "$page"' EXIT
scripts/validation-table.sh "${1:-build}" >"$table"
/usr/bin/python3 - docs/validation.md "$table" "$page" <<'PY'
import sys
doc, table, out = sys.argv[1:]
text = open(doc).read()
begin, end = "<!-- validation-table:begin -->", "<!-- validation-table:end -->"
head, rest = text.split(begin)
_, tail = rest.split(end)
open(out, "w").write(head + begin + "\n" + open(table).read() + end + tail)
PY
cat "$page" >docs/validation.md
