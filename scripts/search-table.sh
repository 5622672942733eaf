#!/usr/bin/env bash
# Prints the table of docs/search.md: for each space below, `dhelix-plan --search` with every
# constraint off, the best Megatron-LM 1F1B configuration against the best dhelix one, what
# each scheme makes of the other's choice, and the search's counts and CPU time. Takes
# about 2.5 minutes on two cores (Mixtral and Phi the longest); run by hand, not by tests.
# Usage: scripts/search-table.sh [build-dir] [space-name...]
#   SEARCH_ARGS="--no-cp --mbs 1" narrows every space alike (the table then says so).
set -euo pipefail
cd "$(dirname "$0")/.."
plan=${1:-build}/tools/dhelix-plan
shift || true
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# name | dhelix-plan arguments (the paper's jobs search the job file's GPUs, batch and sequence)
spaces=(
  "llama-25b-a40|examples/jobs/llama-25b-a40-dp8-tp8.json"
  "llama-39b-a40|examples/jobs/llama-39b-a40-dp4-tp8-pp2.json"
  "gpt-30b-a40|examples/jobs/gpt-30b-a40-dp4-tp8-pp2.json"
  "llama-39b-a40-16k|examples/jobs/llama-39b-a40-dp2-tp8-cp2-pp2-seq16k.json"
  "llama-66b-a800-16k|examples/jobs/llama-66b-a800-dp2-tp8-cp2-pp2-seq16k.json"
  "phi-31b-a40|examples/jobs/phi-31b-a40-dp16-ep8-pp4.json"
  "llama-3-70b-h100|--model examples/models/hf/llama-3-70b.config.json --cluster h100 --gpus 64 --gbs 1024 --seq 8192"
  "mixtral-8x7b-h100|--model examples/models/hf/mixtral-8x7b-v0.1.config.json --cluster h100 --gpus 64 --gbs 1024 --seq 4096"
  "llama-3.1-405b-h100|--model examples/models/hf/llama-3.1-405b.config.json --cluster h100 --gpus 1024 --gbs 1024 --seq 8192"
)

wanted=("$@")
for entry in "${spaces[@]}"; do
  name=${entry%%|*}
  args=${entry#*|}
  if [[ ${#wanted[@]} -gt 0 && ! " ${wanted[*]} " =~ " $name " ]]; then continue; fi
  # shellcheck disable=SC2086  # the arguments are words on purpose
  /usr/bin/time -f '%U %S %e' -o "$scratch/$name.time" \
    "$plan" $args ${SEARCH_ARGS:-} --search --report json >"$scratch/$name.json"
done

echo "dhelix-plan --search ${SEARCH_ARGS:-(every constraint off)}; $(nproc) CPUs"
echo
exec /usr/bin/python3 - "$scratch" <<'PY'
import json, os, sys

scratch = sys.argv[1]
print("| space | GPUs | best Megatron-LM 1F1B | its time | dhelix on it | best dhelix | its time "
      "| Megatron on it | gain | configurations: enumerated / pruned / planned | search CPU |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for file in sorted(f for f in os.listdir(scratch) if f.endswith(".json")):
    name = file[:-5]
    r = json.load(open(os.path.join(scratch, file)))
    user, system, wall = (float(x) for x in open(os.path.join(scratch, name + ".time")).read().split())
    configs = r["configurations"]
    n = r["counts"]
    def cell(index, scheme):
        return f"{configs[index][scheme]['iteration_us'] / 1e6:.2f} s" if index is not None else "-"
    d, m = r["best_dhelix"], r["best_megatron"]
    def other(index, scheme):
        c = configs[index] if index is not None else None
        if c is None:
            return "-"
        f = c[scheme]
        return f"{f['iteration_us'] / 1e6:.2f} s" + ("" if f["fits"] else " (OOM)")
    print(f"| {name} | {r['gpus']} | {configs[m]['label'] if m is not None else 'none fits'} "
          f"| {cell(m, 'megatron-1f1b')} | {other(m, 'dhelix')} "
          f"| {configs[d]['label'] if d is not None else 'none fits'} | {cell(d, 'dhelix')} "
          f"| {other(d, 'megatron-1f1b')} | {r['gain']:.2f}x "
          f"| {n['enumerated']} / {n['pruned']} / {n['planned']} | {user + system:.0f} s |")
PY
