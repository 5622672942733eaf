#!/usr/bin/env bash
# Fuzzes every file reader: builds the libFuzzer targets of tests/fuzz with clang in their
# own build folder (ASan + UBSan, nothing but dhelix_core), then runs each target for the
# given number of seconds on a copy of its seed corpus (tests/fuzz/corpus/<reader>/), as
# many at once as there are cores. Exits 1 when any target crashes and prints where its
# reproducer is; rerun one with `<build>/tests/fuzz/dhelix_<reader>_fuzzer <reproducer>`.
#
#   scripts/fuzz.sh [seconds-per-target]     (default 600)
#
# Environment: DHELIX_FUZZ_BUILD_DIR (default build-fuzz), DHELIX_FUZZ_TARGETS (readers to
# run, space-separated; default all), DHELIX_FUZZ_JOBS (targets at once; default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-600}"
build="${DHELIX_FUZZ_BUILD_DIR:-build-fuzz}"
read -r -a targets <<<"${DHELIX_FUZZ_TARGETS:-model hf_config cluster job profile plan}"
parallel="${DHELIX_FUZZ_JOBS:-$(nproc)}"

# Warnings fail the main (gcc) build; here only what the fuzzers find fails. -O1 with line
# tables only: half the compile time of -O2 -g, and sanitizer reports still name lines.
cmake -S . -B "$build" -DDHELIX_BUILD_FUZZERS=ON -DDHELIX_BUILD_TESTS=OFF \
  -DDHELIX_BUILD_BENCHMARKS=OFF -DDHELIX_WITH_CUDA=OFF -DDHELIX_WERROR=OFF \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -gline-tables-only" >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null

runs="$build/fuzz-runs/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$runs"

# One target: a fresh copy of the corpus (the run adds what it finds there, never to the
# checked-in seeds); crashes, timeouts and leaks land in $runs/<reader>/ as crash-<sha1> etc.
fuzz_one() {
  local reader="$1" out="$runs/$1" rc=0
  mkdir -p "$out/corpus"
  cp tests/fuzz/corpus/"$reader"/* "$out/corpus/"
  "$build/tests/fuzz/dhelix_${reader}_fuzzer" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -max_len=32768 -dict=tests/fuzz/json.dict -print_final_stats=1 \
    -artifact_prefix="$out/" "$out/corpus" >"$out/log" 2>&1 || rc=$?
  echo "$rc" >"$out/rc"
}

for reader in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || true; done
  fuzz_one "$reader" &
done
wait

failed=0
for reader in "${targets[@]}"; do
  out="$runs/$reader"
  done_line="$(grep -E '^#[0-9]+[[:space:]]+DONE' "$out/log" | tail -n 1 || true)"
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/log" | tail -n 1)"
  reproducers="$(find "$out" -maxdepth 1 -type f \
    \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | sort)"
  if [ "$(cat "$out/rc" 2>/dev/null || echo missing)" != 0 ] || [ -n "$reproducers" ]; then
    failed=1
    echo "fuzz: $reader: FAILED (log: $out/log)"
    grep -m 5 -E 'ERROR: |runtime error:|uncaught exception|Check failed' "$out/log" || true
    for file in $reproducers; do echo "fuzz: $reader: reproducer: $file"; done
  else
    echo "fuzz: $reader: ok, ${execs:-?} runs in ${seconds}s;${done_line#*DONE}"
  fi
done
exit "$failed"
