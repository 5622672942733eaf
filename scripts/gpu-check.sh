#!/usr/bin/env bash
# gpu-check.sh: the one command to run on a new GPU machine (and that the project runs
# whenever one is lent to it). One rank on one GPU, about 9 minutes on 16 cores, every step
# under one deadline so that a hang cannot eat the budget; results written as they come.
#
#   scripts/gpu-check.sh [OUT_DIR]     (default ./gpu-check-out)
#   env: BUDGET_S (540), JOBS (every core), DHELIX_BUILD_DIR (./build-gpu), CUDA_HOME,
#        DHELIX_PREBUILT=1 (use the binaries in the build dir as they are: scripts/gpu-lib.sh)
#
# The steps, most valuable first (cap / reserve for the steps after, seconds):
#   0. facts: GPU, driver, CUDA, NCCL and cuDNN versions, cores, ccache;
#   1. build dhelix-plan, dhelix-run, dhelix-profile and dhelix_gpu_tests with every core
#      through ccache (300 / 180); skipped without a GPU (a build dir with tools in it is
#      still used for the CPU half of step 4);
#   2. the gpu-labelled tests: dhelix_gpu_tests run directly (one CUDA start-up instead of
#      one per ctest case); a test that hangs is named and the rest rerun without it (180 / 150);
#   3. the attention engine dhelix-run chose and why (from step 4's log) and cuDNN's own
#      test verdicts (from step 2's);
#   4. one-rank plans of the tiny examples (dense, full recompute, MoE): `--verify` bitwise
#      under jitter on CUDA, then 10 training steps on CUDA and on the CPU backend, losses
#      compared (docs/gpu.md: about 1 %);
#   5. dhelix-profile --backend cuda on one device: the time of each kernel family.
# Exit status 0 when no check FAILed: without a GPU every GPU step is a SKIP that says
# "no GPU", so the script passes (tests/e2e/gpu_scripts_test.sh runs it that way).
#
# What ONE GPU cannot check, printed at the end: NCCL collectives between 2+ members
# (TP/DP/CP/EP), pipeline channels, the DP gradient buckets, the profiler's collectives and
# compute x communication pairs. tests/e2e/run_cuda_test.sh needs 2 to 4 GPUs for those.
# How to read the summary: docs/gpu.md, "The GPU self-check".
set -uo pipefail # no -e: every step reports and the script goes on
SRC=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-./gpu-check-out}
BUDGET_S=${BUDGET_S:-540}
# shellcheck source=gpu-lib.sh
. "$SRC/scripts/gpu-lib.sh"
gpu_lib_init
mkdir -p "$OUT/plans" "$OUT/loss"
DATA=$SRC/examples/data/corpus.txt
RUN=$BUILD/tools/dhelix-run
PLAN=$BUILD/tools/dhelix-plan
PROFILE=$BUILD/tools/dhelix-profile
GTESTS=$BUILD/tests/dhelix_gpu_tests

# ---------------------------------------------------------------------------------------
# 0. Facts
note "dhelix gpu-check, $(date -Is), $(git -C "$SRC" rev-parse --short=12 HEAD 2>/dev/null || echo 'no git'), budget ${BUDGET_S} s, ${JOBS} build jobs"
# docs/gpu.md, checklist 2: dhelix-run sets these itself; a site's values would change what
# is measured (Megatron-LM recipes set CUDA_DEVICE_MAX_CONNECTIONS=1).
for variable in CUDA_MODULE_LOADING CUDA_DEVICE_MAX_CONNECTIONS NCCL_RUNTIME_CONNECT NCCL_ALGO NCCL_PROTO \
  DHELIX_ATTENTION; do
  if [ -n "${!variable+x}" ]; then
    note "INFO  $variable=${!variable} was set; unset for this check"
    unset "$variable"
  fi
done
GPUS=$(count_gpus)
if [ "$GPUS" -gt 0 ]; then
  nvidia-smi >"$LOGS/nvidia-smi.log" 2>&1
  note "INFO  GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n 1) ($GPUS visible; one is used)"
else
  note "INFO  no GPU: nvidia-smi lists none; every GPU step below is skipped"
fi
note "INFO  nvcc $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' | grep . || echo 'not found'); ccache $(command -v ccache >/dev/null && echo yes || echo 'no (every build is full)')"
for header in "$CUDA_HOME/include/nccl.h" /usr/include/nccl.h; do
  [ -f "$header" ] && note "INFO  NCCL $(awk '$2 ~ /^NCCL_(MAJOR|MINOR|PATCH)$/ { v = v (v ? "." : "") $3 } END { print v }' "$header") ($header)" && break
done
for header in "$CUDA_HOME/include/cudnn_version.h" /usr/include/cudnn_version.h /usr/include/x86_64-linux-gnu/cudnn_version.h; do
  [ -f "$header" ] && note "INFO  cuDNN $(awk '$2 ~ /^CUDNN_(MAJOR|MINOR|PATCHLEVEL)$/ { v = v (v ? "." : "") $3 } END { print v }' "$header") ($header)" && break
done

# ---------------------------------------------------------------------------------------
# 1. Build
if [ "$GPUS" -eq 0 ]; then
  result SKIP build "no GPU (the tools already in $BUILD, if any, serve the CPU half of step 4)"
else
  ensure_built "$(budget 300 180)" dhelix-plan dhelix-run dhelix-profile dhelix_gpu_tests
  grep -q '^DHELIX_WITH_CUDNN:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null ||
    note "INFO  built without cuDNN (no cudnn_graph.h): attention runs on dhelix's own kernel"
fi

# ---------------------------------------------------------------------------------------
# 2. The gpu-labelled tests, run directly; a hanging test is named and skipped on rerun
gtest_done() { # the tests a gtest log finished (OK, FAILED or SKIPPED), one per line
  sed -n 's/^\[ *\(OK\|FAILED\|SKIPPED\) *\] \([A-Za-z0-9_/.]*\) (.*/\2/p' "$1"
}
if [ "$GPUS" -eq 0 ]; then
  result SKIP gpu-tests "no GPU"
elif [ ! -x "$GTESTS" ]; then
  result FAIL gpu-tests "dhelix_gpu_tests was not built"
else
  exclude="" round=1 passed=0 failed="" hung=""
  while :; do
    secs=$(budget 180 150)
    [ "$secs" -eq 0 ] && break
    run_logged "gpu-tests-$round" "$secs" "$GTESTS" "--gtest_filter=*${exclude:+-$exclude}"
    rc=$?
    log=$LOGS/gpu-tests-$round.log
    passed=$((passed + $(grep -c '^\[ *OK *\]' "$log")))
    failed="$failed $(sed -n 's/^\[ *FAILED *\] \([A-Za-z0-9_/.]*\) (.*/\1/p' "$log" | tr '\n' ' ')"
    ((rc != 124 && rc != 137)) && break
    culprit=$(grep '^\[ RUN *\]' "$log" | tail -n 1 | awk '{ print $NF }')
    hung="$hung $culprit"
    exclude=$(
      gtest_done "$log"
      tr ' ' '\n' <<<"$exclude $hung" | sed 's/:/\n/g'
    )
    exclude=$(grep -v '^$' <<<"$exclude" | sort -u | paste -sd:)
    round=$((round + 1))
  done
  skipped=$(cat "$LOGS"/gpu-tests-*.log | grep -c '^\[ *SKIPPED *\] [A-Za-z0-9_/.]* (')
  failed=$(xargs <<<"$failed") hung=$(xargs <<<"$hung")
  if [ -z "$failed" ] && [ -z "$hung" ] && [ "$passed" -gt 0 ]; then
    result PASS gpu-tests "$passed passed, $skipped skipped"
  else
    result FAIL gpu-tests "$passed passed, $skipped skipped; failed: ${failed:-none}; hung: ${hung:-none}"
  fi
  grep -h -A2 '^\[ *SKIPPED *\] [A-Za-z]\|: Skipped$' "$LOGS"/gpu-tests-*.log |
    grep -vE '^\[|^--$|: Skipped$|^[[:space:]]*$' | sort -u | head -n 5 | sed 's/^/      skip reason: /' | tee -a "$SUMMARY"
fi

# ---------------------------------------------------------------------------------------
# 4. One-rank plans (step 3, the attention engine, is read from these runs' logs)
losses() { sed -n 's/.*"loss": \([^,]*\),.*/\1/p' "$1" 2>/dev/null; }
make_plan() { # make_plan NAME JOB ARGS...: $OUT/plans/NAME.json from a shipped job
  local name=$1 job=$2
  shift 2
  if run_logged "plan-$name" "$(budget 60 20)" "$PLAN" "$SRC/examples/jobs/$job" "$@" \
    -o "$OUT/plans/$name.json"; then
    return 0
  fi
  result FAIL "plan-$name" "$(first_error "$LOGS/plan-$name.log")"
  return 1
}
run_rank() { # run_rank LOGNAME BACKEND PLAN STEPS ARGS...: one dhelix-run rank (an MPI singleton)
  local name=$1 backend=$2 plan=$3 steps=$4 deadline watchdog=()
  shift 4
  deadline=$(budget 120 "${RESERVE:-30}")
  # On CUDA, dhelix's watchdog (half the step's deadline) names the busy streams of a hang
  # before the deadline kills the run without a word (docs/gpu.md, "Review", point 8).
  [ "$backend" = cuda ] && [ "$deadline" -ge 2 ] && watchdog=(--watchdog-s "$((deadline / 2))")
  run_logged "$name" "$deadline" env NCCL_ALGO=Ring NCCL_PROTO=Simple \
    "$RUN" --backend "$backend" --plan "$OUT/plans/$plan.json" --data "$DATA" --steps "$steps" \
    "${watchdog[@]}" "$@"
}
verify_on_gpu() { # verify_on_gpu PLAN: 3 steps of --verify under jitter
  if run_rank "verify-$1" cuda "$1" 3 --verify --jitter-us 200 &&
    grep -q '^verify step 3: co-executed and sequential schedules bitwise equal' "$LOGS/verify-$1.log"; then
    result PASS "verify-$1" "3 steps bitwise under jitter (${LAST_WALL} s)"
  else
    result FAIL "verify-$1" "$(why $?): $(first_error "$LOGS/verify-$1.log")"
  fi
}
train_both() { # train_both PLAN: 10 steps on CUDA (with a GPU) and on the CPU, losses compared
  local plan=$1 a=$OUT/loss/$1-cuda.jsonl b=$OUT/loss/$1-cpu.jsonl
  rm -f "$a" "$b"
  if run_rank "train-$plan-cpu" cpu "$plan" 10 --loss-log "$b"; then
    result PASS "train-$plan-cpu" "loss $(losses "$b" | head -n 1) -> $(losses "$b" | tail -n 1)"
  else
    result FAIL "train-$plan-cpu" "$(why $?): $(first_error "$LOGS/train-$plan-cpu.log")"
  fi
  [ "$GPUS" -eq 0 ] && return
  if ! run_rank "train-$plan-cuda" cuda "$plan" 10 --loss-log "$a"; then
    result FAIL "train-$plan-cuda" "$(why $?): $(first_error "$LOGS/train-$plan-cuda.log")"
    return
  fi
  local worst
  worst=$(paste <(losses "$a") <(losses "$b") |
    awk 'NF == 2 && $2 != 0 { d = ($1 - $2) / $2; d = d < 0 ? -d : d; if (d > m) m = d; n++ } END { printf "%.4f over %d steps", m, n }')
  local verdict=PASS
  awk -v w="${worst%% *}" 'BEGIN { exit !(w <= 0.05) }' || verdict=WARN
  result "$verdict" "loss-cuda-vs-cpu-$plan" "largest relative difference $worst (docs/gpu.md: about 1 %)"
}
if [ ! -x "$PLAN" ] || [ ! -x "$RUN" ]; then
  result SKIP one-rank-runs "no dhelix-plan and dhelix-run in $BUILD"
else
  if make_plan tiny tiny-tp2.json --tp 1 --no-sp; then
    if [ "$GPUS" -gt 0 ]; then
      RESERVE=90 verify_on_gpu tiny
      attention=$(grep -h 'attention: ' "$LOGS/verify-tiny.log" | head -n 1 | sed 's/.*attention: //')
      result INFO attention-engine "${attention:-not printed: see $LOGS/verify-tiny.log}"
    else
      result SKIP verify-tiny "no GPU"
    fi
    RESERVE=75 train_both tiny
  fi
  if make_plan tiny-recompute tiny-tp2-recompute.json --tp 1 --no-sp; then
    if [ "$GPUS" -gt 0 ]; then RESERVE=70 verify_on_gpu tiny-recompute; else result SKIP verify-tiny-recompute "no GPU"; fi
  fi
  if make_plan tiny-moe tiny-moe-ep2.json --dp 1 --ep 1; then
    if [ "$GPUS" -gt 0 ]; then RESERVE=50 verify_on_gpu tiny-moe; else result SKIP verify-tiny-moe "no GPU"; fi
    RESERVE=40 train_both tiny-moe
  fi
fi

# ---------------------------------------------------------------------------------------
# 5. dhelix-profile --backend cuda on one device: each kernel family's time
if [ "$GPUS" -eq 0 ]; then
  result SKIP profile-cuda "no GPU"
elif [ ! -x "$PROFILE" ]; then
  result FAIL profile-cuda "dhelix-profile was not built"
else
  secs=$(budget 90 10)
  if [ "$secs" -eq 0 ]; then
    result SKIP profile-cuda "no time left"
  elif run_logged profile-cuda "$secs" "$PROFILE" --backend cuda "$SRC/examples/jobs/tiny-tp2.json" \
    --tp 1 --no-sp --warmup 2 --samples 5 --max-samples 20 -o "$OUT/profile-tiny.json"; then
    result PASS profile-cuda "$OUT/profile-tiny.json (${LAST_WALL} s)"
    "$SRC/scripts/profile-table.py" --families "$OUT/profile-tiny.json" 2>&1 | sed 's/^/      /' | tee -a "$SUMMARY"
  else
    result FAIL profile-cuda "$(why $?): $(first_error "$LOGS/profile-cuda.log")"
  fi
fi

# ---------------------------------------------------------------------------------------
# The end
if [ "$GPUS" -gt 0 ]; then
  leftovers=$(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader 2>/dev/null)
  [ -n "$leftovers" ] && result WARN leftovers "processes still on the GPU: $leftovers"
fi
note "----  not checked with one GPU: NCCL collectives between 2+ members (TP/DP/CP/EP), pipeline"
note "      channels, DP gradient buckets, the profiler's collectives and pairs; run"
note "      tests/e2e/run_cuda_test.sh on 2 to 4 GPUs for those."
note "----  $FAILS FAIL; $(($(date +%s) - T0)) s; summary $SUMMARY, logs $LOGS"
[ "$FAILS" -eq 0 ]
