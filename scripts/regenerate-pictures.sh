#!/usr/bin/env bash
# Rewrites the pictures the docs show: the README's pipeline and pairing pictures (with the
# README's own command), docs/pipeline.md's picture of every scheme, docs/concepts.md's
# picture and docs/design.md's layout. The e2e_docs and docs_layout tests fail when the
# checked-in files differ from what these commands make.
#
#   scripts/regenerate-pictures.sh [build-dir]     (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
"$build/tools/dhelix-plan" examples/jobs/llama-39b-a40-dp4-tp8-pp2.json --gbs 48 --shape w --no-split-backward \
  --svg docs/images/llama-39b-a40-pp2 >/dev/null
# docs/pipeline.md's pictures (every scheme): Llama 8B on 4 stages, 8 micro-batches.
"$build/tools/dhelix-plan" examples/jobs/llama-8b-a40-dp16-tp4.json --dp 4 --pp 4 --gbs 32 \
  --svg docs/images/llama-8b-pp4 >/dev/null
python3 scripts/concepts-figure.py docs/images/concepts.svg
python3 scripts/layout-figure.py docs/images/layout.svg
echo "regenerated docs/images/{llama-39b-a40-pp2,llama-8b-pp4}-{pipeline,pairing,schemes}.svg," \
  "concepts.svg and layout.svg"
