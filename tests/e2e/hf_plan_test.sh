#!/usr/bin/env bash
# The HuggingFace configs of the architectures people train today plan end to end with
# dhelix-plan: Qwen2.5-7B (Qwen2), Mistral-7B (sliding window), Qwen1.5-MoE-A2.7B
# (Qwen2-MoE, shared expert). Each report names the model and its parameter count.
#
#   hf_plan_test.sh TOOLS_DIR SOURCE_DIR
set -euo pipefail
tools=$1
src=$2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

plan() {  # name, expected parameter figure in --validate-only, then the flags
  local name=$1 params=$2
  shift 2
  local config="$src/examples/models/hf/$name.config.json"
  "$tools/dhelix-plan" --validate-only --model "$config" "$@" >"$scratch/$name.validate"
  if ! grep -q "$params" "$scratch/$name.validate"; then
    echo "FAIL: $name: --validate-only does not show $params parameters:" >&2
    cat "$scratch/$name.validate" >&2
    exit 1
  fi
  "$tools/dhelix-plan" --model "$config" "$@" -o "$scratch/$name.plan.json" >"$scratch/$name.report"
  if ! grep -q "^dhelix " "$scratch/$name.report"; then
    echo "FAIL: $name: no dhelix row in the report:" >&2
    cat "$scratch/$name.report" >&2
    exit 1
  fi
  echo "ok: $name"
}

plan qwen2.5-7b "7.62 B" --cluster h100 --tp 4 --sp --dp 4 --gbs 64 --seq 4096
plan mistral-7b-v0.1 "7.24 B" --cluster h100 --tp 8 --sp --dp 2 --gbs 32 --seq 8192
plan qwen1.5-moe-a2.7b "14.32 B" --cluster h100 --tp 2 --sp --ep 4 --dp 8 --gbs 64 --seq 4096

# The sliding window reaches the operators: Mistral's attention signature carries it.
grep -q 'causal,w=4096' "$scratch/mistral-7b-v0.1.plan.json" ||
  { echo "FAIL: the Mistral plan's attention ops carry no window" >&2; exit 1; }
echo "ok: mistral window"
