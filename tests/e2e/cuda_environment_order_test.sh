#!/usr/bin/env bash
# The environment CUDA reads when it starts is in place before MPI_Init (issue 31, point 4;
# runtime/cuda/cuda_environment.h): a CUDA-aware MPI may start CUDA inside MPI_Init, after
# which CUDA ignores CUDA_MODULE_LOADING and CUDA_DEVICE_MAX_CONNECTIONS. A preloaded
# library (mpi_init_probe.cc) prints both as MPI_Init_thread sees them; no GPU is needed
# (the runs then stop at "no CUDA device found", after MPI_Init).
#   * dhelix-run --backend cuda and dhelix-profile --backend cuda: LAZY, 32 and
#     NCCL_RUNTIME_CONNECT=0 at MPI_Init;
#   * a user's value is kept; --backend cpu leaves both unset.
# Usage: cuda_environment_order_test.sh BIN_DIR SOURCE_DIR PROBE_LIBRARY <ON|OFF: with CUDA>
# Exits 77 (skipped) without CUDA: nothing is set then.
set -uo pipefail
bin=${1:?usage: cuda_environment_order_test.sh BIN_DIR SOURCE_DIR PROBE ON|OFF}
src=${2:?usage: cuda_environment_order_test.sh BIN_DIR SOURCE_DIR PROBE ON|OFF}
probe=${3:?usage: cuda_environment_order_test.sh BIN_DIR SOURCE_DIR PROBE ON|OFF}
with_cuda=${4:?usage: cuda_environment_order_test.sh BIN_DIR SOURCE_DIR PROBE ON|OFF}
case "$with_cuda" in
  ON | on | TRUE | true | 1) ;;
  *)
    echo "skipped: built without CUDA"
    exit 77
    ;;
esac
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plan=$src/examples/plans/tiny-tp2.json
job=$src/examples/jobs/tiny-tp2.json
corpus=$src/examples/data/corpus.txt
passed=0
failed=0

# expect NAME EXPECTED-LINES... -- COMMAND...: runs COMMAND (one rank, MPI's singleton
# start) with the probe preloaded and both variables unset unless NAME's case sets them.
expect() {
  local name=$1
  shift
  local expected=()
  while [ "$1" != "--" ]; do
    expected+=("$1")
    shift
  done
  shift
  env -u CUDA_MODULE_LOADING -u CUDA_DEVICE_MAX_CONNECTIONS -u NCCL_RUNTIME_CONNECT LD_PRELOAD="$probe" "$@" \
    >"$work/out" 2>&1
  local line
  for line in "${expected[@]}"; do
    if ! grep -qxF -- "mpi-init-probe: $line" "$work/out"; then
      failed=$((failed + 1))
      echo "FAIL  $name: MPI_Init did not see $line"
      cat "$work/out"
      return
    fi
  done
  passed=$((passed + 1))
  echo "ok    $name"
}

expect "dhelix-run --backend cuda" CUDA_MODULE_LOADING=LAZY CUDA_DEVICE_MAX_CONNECTIONS=32 \
  NCCL_RUNTIME_CONNECT=0 -- \
  "$bin/dhelix-run" --backend cuda --plan "$plan" --data "$corpus" --steps 1
expect "dhelix-run --backend=cuda" CUDA_MODULE_LOADING=LAZY CUDA_DEVICE_MAX_CONNECTIONS=32 -- \
  "$bin/dhelix-run" --plan "$plan" --data "$corpus" --steps 1 --backend=cuda
expect "dhelix-run keeps the user's values (EAGER: the option)" CUDA_MODULE_LOADING=EAGER \
  CUDA_DEVICE_MAX_CONNECTIONS=24 -- env CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=24 \
  "$bin/dhelix-run" --backend cuda --plan "$plan" --data "$corpus" --steps 1
expect "dhelix-run --backend cpu sets nothing" "CUDA_MODULE_LOADING=<unset>" \
  "CUDA_DEVICE_MAX_CONNECTIONS=<unset>" "NCCL_RUNTIME_CONNECT=<unset>" -- \
  "$bin/dhelix-run" --backend cpu --plan "$plan" --data "$work/missing.txt" --steps 1
expect "dhelix-profile --backend cuda" CUDA_MODULE_LOADING=LAZY CUDA_DEVICE_MAX_CONNECTIONS=32 \
  NCCL_RUNTIME_CONNECT=0 -- \
  "$bin/dhelix-profile" --backend cuda "$job" -o "$work/p.json"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
