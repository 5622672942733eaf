# shellcheck shell=bash
# What scripts/gpu-check.sh and scripts/gpu-first-light.sh share: one deadline for the
# whole script, every step under `timeout` within it, a summary line per result written the
# moment it is known, and the build of the GPU targets. Sourced, never run.
#
# Why a deadline and not per-step timeouts alone: device time is lent in one budget
# (start-up, commands and idle time together, about 15 minutes), so a hang in step 2 must
# not eat the time of steps 3 to 5. Each step asks budget() for its seconds: at most its
# own cap, and never so much that the steps after it lose their reserve.
#
# The caller sets SRC (the project root), OUT (the results folder) and BUDGET_S, then calls
# gpu_lib_init. Results: $OUT/summary.txt (one line per check: PASS, FAIL, WARN, SKIP or
# INFO, then the check's name and what it found) and $OUT/logs/NAME.log per command.

gpu_lib_init() {
  mkdir -p "$OUT/logs" || exit 2
  OUT=$(cd "$OUT" && pwd)
  LOGS=$OUT/logs
  SUMMARY=$OUT/summary.txt
  T0=$(date +%s)
  LAST_WALL=0
  FAILS=0
  : >"$SUMMARY"
  BUILD=${DHELIX_BUILD_DIR:-$SRC/build-gpu}
  JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
  CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
  if [ -x "$CUDA_HOME/bin/nvcc" ] && ! command -v nvcc >/dev/null 2>&1; then
    export PATH="$CUDA_HOME/bin:$PATH" # scripts/build.sh: CMake finds CUDA through nvcc
  fi
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

# Seconds left of the script's budget.
left() { echo $((BUDGET_S - ($(date +%s) - T0))); }

# budget CAP RESERVE: the seconds a step may take: at most CAP, leaving RESERVE for the
# steps after it; 0 (skip the step) when fewer than 10 would be left.
budget() {
  local allowed=$(($(left) - $2))
  ((allowed > $1)) && allowed=$1
  ((allowed < 10)) && allowed=0
  echo "$allowed"
}

note() { printf '%s\n' "$*" | tee -a "$SUMMARY"; }

# result STATUS NAME [DETAIL]: one summary line; FAIL lines are counted for the exit status.
result() {
  [ "$1" = FAIL ] && FAILS=$((FAILS + 1))
  printf '%-4s  %-30s %s\n' "$1" "$2" "${3:-}" | tee -a "$SUMMARY"
}

# run_logged NAME SECONDS CMD...: CMD under timeout (killed 10 s after TERM), its output in
# $LOGS/NAME.log; returns CMD's status (124 or 137: timed out), wall seconds in LAST_WALL.
run_logged() {
  local secs=$2 log="$LOGS/$1.log" started rc
  shift 2
  started=$(date +%s%N)
  {
    printf '+'
    printf ' %q' "$@"
    printf '\n# timeout %s s, started %s\n' "$secs" "$(date -Is)"
  } >"$log"
  timeout -k 10 "$secs" "$@" >>"$log" 2>&1
  rc=$?
  LAST_WALL=$(awk -v a="$started" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
  printf '# exit %s after %s s%s\n' "$rc" "$LAST_WALL" \
    "$( ((rc == 124 || rc == 137)) && echo ' (TIMED OUT)')" >>"$log"
  return "$rc"
}

# why RC: an exit status in words (lib/error.h's statuses).
why() {
  case $1 in
    0) echo ok ;; 124 | 137) echo "timed out" ;; 1) echo "exit 1 (a check or --verify failed)" ;;
    2) echo "exit 2 (invalid input)" ;; 4) echo "exit 4 (unsupported)" ;;
    70) echo "exit 70 (internal error)" ;; *) echo "exit $1" ;;
  esac
}

# first_error LOG: the first two error lines of LOG on one line, at most 300 characters.
first_error() { grep -m 2 -E 'error|Error|FAILED' "$1" 2>/dev/null | tr '\n' ' ' | cut -c1-300; }

# The number of GPUs nvidia-smi lists (0 without a driver, or with DHELIX_NO_GPU=1: the
# mode a machine without a GPU runs, forced by tests/e2e/gpu_scripts_test.sh).
count_gpus() {
  if [ "${DHELIX_NO_GPU:-0}" = 1 ] || ! command -v nvidia-smi >/dev/null 2>&1; then
    echo 0
    return
  fi
  nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true
}

# build_gpu_targets SECONDS TARGET...: within SECONDS in all, configure $BUILD with CUDA on
# (tests on, benchmarks off, warnings not errors: a new toolkit's first warning must not
# stop a device run) and build only TARGETs with every core, through ccache when it is installed (a second call on
# a warm machine is then incremental). Returns the build's status.
build_gpu_targets() {
  local secs=$1 launcher=() args=()
  shift
  if command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  run_logged configure 120 cmake -S "$SRC" -B "$BUILD" \
    -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG" \
    -DDHELIX_WITH_CUDA=ON -DDHELIX_WERROR=OFF -DDHELIX_BUILD_TESTS=ON \
    -DDHELIX_BUILD_BENCHMARKS=OFF "${launcher[@]}" || return $?
  for target in "$@"; do args+=(--target "$target"); done
  secs=$(awk -v s="$secs" -v w="$LAST_WALL" 'BEGIN { printf "%d", s - w }')
  run_logged build "$secs" cmake --build "$BUILD" --parallel "$JOBS" "${args[@]}"
}

# The binary each target of build_gpu_targets makes.
target_binary() {
  case $1 in
    dhelix-*) echo "$BUILD/tools/$1" ;;
    *) echo "$BUILD/tests/$1" ;;
  esac
}

# ensure_built SECONDS TARGET...: with DHELIX_PREBUILT=1, the binaries already in $BUILD
# (built on another machine with the same libraries and carried over: a cold CUDA build
# costs minutes of lent device time) when every one is there and the loader finds all
# their libraries; otherwise build_gpu_targets. One summary line either way.
ensure_built() {
  local secs=$1 target binary missing=""
  shift
  if [ "${DHELIX_PREBUILT:-0}" = 1 ]; then
    for target in "$@"; do
      binary=$(target_binary "$target")
      if [ ! -x "$binary" ]; then
        missing="$missing ${binary#"$BUILD"/}"
      elif ldd "$binary" 2>/dev/null | grep -q 'not found'; then
        missing="$missing ${binary#"$BUILD"/}($(ldd "$binary" | awk '/not found/ { print $1 }' | paste -sd,))"
      fi
    done
    if [ -z "$missing" ]; then
      result PASS build "prebuilt binaries in $BUILD, every library found"
      return 0
    fi
    note "INFO  DHELIX_PREBUILT=1 but not usable:$missing; building"
  fi
  if build_gpu_targets "$secs" "$@"; then
    result PASS build "${LAST_WALL} s with $JOBS jobs"
  else
    result FAIL build "$(why $?) after ${LAST_WALL} s: $(first_error "$LOGS/build.log")"
    return 1
  fi
}
