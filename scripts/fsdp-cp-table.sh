#!/usr/bin/env bash
# Prints the FSDP and context-parallel tables of docs/validation.md ("FSDP and all-to-all
# context parallelism on H100"):
# 1. for Llama-3-70B and Mixtral-8x7B on 64 and 1024 H100s, fixed layouts planned with each
#    CP communication type and with and without fully sharded data parallelism: the
#    communication of that kind per GPU and iteration, the share dhelix hides, the share the
#    best baseline as frameworks run it hides (Megatron's a2a and all-gather CP run exposed,
#    FSDP prefetches one layer ahead), and dhelix's gain over that baseline;
# 2. what `dhelix-plan --search` picks for each space, and whether it uses them.
# Takes about 10 minutes on two cores (the 1024-GPU searches the longest); run by hand, not
# by tests (like scripts/search-table.sh). Usage: scripts/fsdp-cp-table.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
plan=${1:-build}/tools/dhelix-plan
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

llama="--model examples/models/hf/llama-3-70b.config.json --cluster h100 --gbs 1024 --seq 8192"
mixtral="--model examples/models/hf/mixtral-8x7b-v0.1.config.json --cluster h100 --gbs 1024 --seq 4096"

# name | kind (the communication the row is about: cp or dp) | dhelix-plan arguments
rows=(
  "llama-3-70b 64 p2p|cp|$llama --sp --tp 4 --cp 2 --pp 4 --dp 2 --cp-comm-type p2p"
  "llama-3-70b 64 a2a|cp|$llama --sp --tp 4 --cp 2 --pp 4 --dp 2 --cp-comm-type a2a"
  "llama-3-70b 64 allgather|cp|$llama --sp --tp 4 --cp 2 --pp 4 --dp 2 --cp-comm-type allgather"
  "llama-3-70b 1024 p2p|cp|$llama --sp --tp 4 --cp 2 --pp 4 --dp 32 --cp-comm-type p2p"
  "llama-3-70b 1024 a2a|cp|$llama --sp --tp 4 --cp 2 --pp 4 --dp 32 --cp-comm-type a2a"
  "llama-3-70b 1024 allgather|cp|$llama --sp --tp 4 --cp 2 --pp 4 --dp 32 --cp-comm-type allgather"
  "llama-3-70b 64 fsdp|dp|$llama --sp --tp 8 --pp 1 --dp 8 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params"
  "llama-3-70b 64 fsdp keep|dp|$llama --sp --tp 8 --pp 1 --dp 8 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --no-fsdp-reshard-after-forward"
  "llama-3-70b 64 fsdp dp16|dp|$llama --sp --tp 4 --pp 1 --dp 16 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params"
  "llama-3-70b 1024 fsdp|dp|$llama --sp --tp 8 --pp 1 --dp 128 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params"
  "llama-3-70b 1024 fsdp dp256|dp|$llama --sp --tp 4 --pp 1 --dp 256 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params"
  "mixtral-8x7b 64 p2p|cp|$mixtral --sp --tp 4 --cp 2 --ep 8 --dp 8 --cp-comm-type p2p"
  "mixtral-8x7b 64 a2a|cp|$mixtral --sp --tp 4 --cp 2 --ep 8 --dp 8 --cp-comm-type a2a"
  "mixtral-8x7b 64 allgather|cp|$mixtral --sp --tp 4 --cp 2 --ep 8 --dp 8 --cp-comm-type allgather"
  "mixtral-8x7b 1024 p2p|cp|$mixtral --sp --tp 4 --cp 2 --ep 8 --dp 128 --cp-comm-type p2p"
  "mixtral-8x7b 1024 a2a|cp|$mixtral --sp --tp 4 --cp 2 --ep 8 --dp 128 --cp-comm-type a2a"
  "mixtral-8x7b 1024 allgather|cp|$mixtral --sp --tp 4 --cp 2 --ep 8 --dp 128 --cp-comm-type allgather"
  "mixtral-8x7b 64 fsdp|dp|$mixtral --sp --tp 4 --ep 8 --dp 16 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params"
  "mixtral-8x7b 1024 fsdp|dp|$mixtral --sp --tp 4 --ep 8 --dp 256 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params"
)
# name | dhelix-plan arguments
# (the FSDP strategy is an axis only where asked: --use-megatron-fsdp; a mixture of experts'
# experts shard over the expert-data-parallel group, docs/search.md)
searches=(
  "llama-3-70b 64|$llama --gpus 64 --use-megatron-fsdp"
  "llama-3-70b 1024|$llama --gpus 1024 --use-megatron-fsdp"
  "mixtral-8x7b 64|$mixtral --gpus 64 --use-megatron-fsdp"
  "mixtral-8x7b 1024|$mixtral --gpus 1024 --use-megatron-fsdp"
)

i=0
for entry in "${rows[@]}"; do
  IFS='|' read -r name kind args <<<"$entry"
  # shellcheck disable=SC2086  # the arguments are words on purpose
  "$plan" $args --allow-oom --report json >"$scratch/row$i.json" 2>"$scratch/row$i.err" || {
    echo "fsdp-cp-table.sh: dhelix-plan failed on $name: $(tail -1 "$scratch/row$i.err")" >&2
    exit 1
  }
  echo "$name|$kind|$args" >"$scratch/row$i.name"
  i=$((i + 1))
done
i=0
for entry in "${searches[@]}"; do
  IFS='|' read -r name args <<<"$entry"
  # shellcheck disable=SC2086
  "$plan" $args --search --report json >"$scratch/search$i.json"
  echo "$name" >"$scratch/search$i.name"
  i=$((i + 1))
done

exec /usr/bin/python3 - "$scratch" <<'PY'
import glob, json, os, sys

scratch = sys.argv[1]

def share(comm):
    total = comm["hidden_us"] + comm["exposed_us"]
    return comm["hidden_us"] / total if total else 0.0

def layout(args):
    words = args.split()
    keep = []
    for flag in ("--tp", "--cp", "--pp", "--dp", "--ep"):
        if flag in words:
            keep.append(flag[2:] + words[words.index(flag) + 1])
    for flag in ("--cp-comm-type", "--data-parallel-sharding-strategy"):
        if flag in words:
            keep.append(words[words.index(flag) + 1])
    if "--no-fsdp-reshard-after-forward" in words:
        keep.append("(keep)")
    return " ".join(keep)

print("| model | GPUs | layout | communication | per GPU and iteration | dhelix hides | "
      "best baseline as run | it hides | dhelix | baseline | gain | fits |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for path in sorted(glob.glob(os.path.join(scratch, "row*.json")),
                   key=lambda p: int(p.split("row")[-1].split(".")[0])):
    name, kind, args = open(path[:-5] + ".name").read().strip().split("|")
    report = json.load(open(path))
    schemes = {s["scheme"]: s for s in report["schemes"]}
    dhelix = schemes["dhelix"]
    best = report["best_baseline"]
    base = schemes[best["scheme"]]
    comm = dhelix["comm"][kind]
    total_s = (comm["hidden_us"] + comm["exposed_us"]) / 1e6
    model, gpus = name.split()[0], name.split()[1]
    print(f"| {model} | {gpus} | {layout(args)} | {kind} | {total_s:.3f} s | "
          f"{100 * share(comm):.1f} % | {best['scheme']} | {100 * share(base['comm'][kind]):.1f} % | "
          f"{dhelix['iteration_us'] / 1e6:.3f} s | {base['iteration_us'] / 1e6:.3f} s | "
          f"{best['dhelix_speedup']:.2f}x | {'yes' if dhelix['fits'] else 'no'} |")

print()
print("| space | dhelix's pick | its iteration | Megatron 1F1B's pick | its iteration | gain |")
print("|---|---|---|---|---|---|")
for path in sorted(glob.glob(os.path.join(scratch, "search*.json"))):
    name = open(path[:-5] + ".name").read().strip()
    report = json.load(open(path))
    configs = report["configurations"]
    d = configs[report["best_dhelix"]]
    m = configs[report["best_megatron"]]
    print(f"| {name} | `{d['label']}` | {d['dhelix']['iteration_us'] / 1e6:.3f} s | "
          f"`{m['label']}` | {m['megatron-1f1b']['iteration_us'] / 1e6:.3f} s | "
          f"{report['gain']:.2f}x |")
PY
