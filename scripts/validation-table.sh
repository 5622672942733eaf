#!/usr/bin/env bash
# Prints the figures of docs/validation.md: plans every A40 and A800 example job (with
# --allow-oom, so that jobs that do not fit still show their figures) and writes one
# markdown row per job: TFLOPS/GPU of Megatron 1F1B, intra-batch, Wavelet+ and DHelix, the
# speed-ups over Megatron, DHelix tokens/s, the pairing scope, the DHelix bubble and whether
# the DHelix plan fits. Usage: scripts/validation-table.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
plan=${1:-build}/tools/dhelix-plan
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
echo "| job | Megatron | intra-batch | Wavelet+ | DHelix | speed-ups (intra / Wavelet+ / DHelix) | DHelix tokens/s | scope | DHelix bubble | fits |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for job in examples/jobs/*a40*.json examples/jobs/*a800*.json; do
  name=$(basename "$job" .json)
  "$plan" "$job" --allow-oom -o "$scratch/$name.json" >/dev/null 2>&1
  /usr/bin/python3 - "$scratch/$name.json" "$name" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
s = {x["scheme"]: x for x in plan["schemes"]}
order = ["megatron-1f1b", "intra-batch", "wavelet+", "dhelix"]
tflops = " | ".join(f"{s[k]['tflops_per_gpu']:.1f}" for k in order)
speedups = " / ".join(f"{s[k]['speedup_vs_megatron']:.2f}" for k in order[1:])
d = s["dhelix"]
print(f"| `{sys.argv[2]}` | {tflops} | {speedups} | {d['tokens_per_second']:.0f} | "
      f"{plan['pairings'][0]['scope']} | {100 * d['bubble_ratio']:.1f} % | {'yes' if d['fits'] else 'no'} |")
PY
done
