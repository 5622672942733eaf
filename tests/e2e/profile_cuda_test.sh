#!/usr/bin/env bash
# End-to-end test of dhelix-profile --backend cuda where there is no GPU (this project's
# machines and CI): a clear error, exit status 4, no output file.
# Usage: profile_cuda_test.sh <dir-with-binaries> <source-dir> <ON|OFF: built with CUDA>
# Exits 77 (skipped) when a GPU is visible: docs/gpu.md has the runs for real clusters.
# The last line is "N passed, M failed"; the exit status is non-zero when anything failed.
set -u

bin_dir=$(cd "$1" && pwd)
src_dir=$(cd "$2" && pwd)
with_cuda=$3
profile="$bin_dir/dhelix-profile"
job="$src_dir/examples/jobs/tiny-tp2.json"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "skipped: a GPU is visible"
  exit 77
fi

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok    $1"; }
fail() { failed=$((failed + 1)); echo "FAIL  $1: $2"; }

"$profile" --backend cuda "$job" -o "$scratch/p.json" >"$scratch/stdout" 2>"$scratch/stderr"
status=$?
err=$(cat "$scratch/stderr")
case "$with_cuda" in
  ON | on | TRUE | true | 1)
    # The reason is CUDA's own text: "no CUDA-capable device is detected", or "CUDA driver
    # version is insufficient for CUDA runtime version" where no driver is installed.
    pattern='^dhelix-profile: error: --backend cuda: no CUDA device found \(cudaGetDeviceCount: [^()]+\)$'
    ;;
  *)
    pattern='^dhelix-profile: error: --backend cuda: this dhelix-profile was built without CUDA \(configure with the CUDA toolkit and NCCL installed; docs/gpu.md\)$'
    ;;
esac
if [ "$status" -ne 4 ]; then
  fail "no GPU" "exit $status, expected 4; stderr: $err"
elif ! printf '%s' "$err" | grep -Eq "$pattern"; then
  fail "no GPU" "stderr: $err"
elif [ -e "$scratch/p.json" ]; then
  fail "no GPU" "wrote a profile"
else
  pass "no GPU: $err"
fi

# --list needs no GPU and no MPI: the profile space is the same for every backend.
if "$profile" --backend cuda --list "$job" >"$scratch/cuda.txt" 2>"$scratch/stderr" &&
  "$profile" --backend model --list "$job" >"$scratch/model.txt" 2>>"$scratch/stderr" &&
  cmp -s "$scratch/cuda.txt" "$scratch/model.txt" && [ -s "$scratch/cuda.txt" ]; then
  pass "--backend cuda --list lists the model backend's ops and pairs"
else
  fail "--backend cuda --list" "$(head -c 2000 "$scratch/stderr")"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
