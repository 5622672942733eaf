#!/usr/bin/env bash
# docs/validation.md's generated tables are what scripts/validation-table.sh prints now: a
# change to the cost model, a preset or an example job must regenerate the page.
# Usage: validation_table_test.sh BUILD_TOOLS_DIR SOURCE_DIR
set -euo pipefail
tools=$1
src=$2
build=$(dirname "$tools")
expected=$(mktemp)
trap 'rm -f "$expected"' EXIT
"$src/scripts/validation-table.sh" "$build" >"$expected"
actual=$(sed -n '/<!-- validation-table:begin -->/,/<!-- validation-table:end -->/p' \
  "$src/docs/validation.md" | sed '1d;$d')
if ! diff <(echo "$actual") "$expected"; then
  echo "docs/validation.md is stale: rerun scripts/update-validation.sh (diff above: page < > now)" >&2
  exit 1
fi
echo "docs/validation.md is current"
