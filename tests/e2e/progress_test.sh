#!/usr/bin/env bash
# Progress bars: drawn on a terminal, absent when output goes to a pipe or a file.
#   1. piped: dhelix-plan planning, dhelix-plan --check and dhelix-profile --backend model
#      write no bar (no carriage return, no "[##..") to stdout or stderr;
#   2. under a pseudo-terminal (python3's pty): each draws its bar, and erases it so that the
#      report that follows starts on a clean line.
# Usage: progress_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin=${1:?usage: progress_test.sh BIN_DIR SOURCE_DIR}
src=${2:?usage: progress_test.sh BIN_DIR SOURCE_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
job=$src/examples/jobs/llama-39b-a40-dp4-tp8-pp2.json
plan=$src/examples/plans/tiny-tp2-pp2.json
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The three commands, by name.
commands=(
  "plan|$bin/dhelix-plan $job -o $work/plan.json"
  "check|$bin/dhelix-plan --check $plan"
  "profile|$bin/dhelix-profile --backend model $job -o $work/profile.json"
)
bar_of() { # the label each command's bar carries
  case $1 in
    plan) echo "planning llama-39b-a40-dp4-tp8-pp2 [" ;;
    check) echo "checking $plan [" ;;
    profile) echo "dhelix-profile: profiling [" ;;
  esac
}

for entry in "${commands[@]}"; do
  name=${entry%%|*}
  read -r -a cmd <<<"${entry#*|}"
  # 1. Piped: nothing but the output itself.
  rm -f "$work/plan.json" "$work/profile.json"
  "${cmd[@]}" >"$work/out" 2>"$work/err" || fail "$name failed piped"
  if grep -q $'\r' "$work/out" "$work/err" || grep -qF "[#" "$work/out" "$work/err" ||
    grep -qF "$(bar_of "$name")" "$work/out" "$work/err"; then
    fail "$name drew a progress bar into a pipe:"
    cat -A "$work/err" | head -5
  fi
  # 2. A terminal: the bar, then the output on a clean line.
  rm -f "$work/plan.json" "$work/profile.json"
  python3 -c 'import pty, sys; sys.exit(pty.spawn(sys.argv[1:]) >> 8)' "${cmd[@]}" \
    </dev/null >"$work/tty" || fail "$name failed on a terminal"
  if ! grep -qaF "$(bar_of "$name")" "$work/tty" || ! grep -qa $'\r' "$work/tty"; then
    fail "$name drew no progress bar on a terminal:"
    cat -A "$work/tty" | head -5
  fi
  # The bar's last draw is blanked: after the last carriage return of the bar (the terminal
  # turns each newline into CR LF; those are dropped first), only the output follows.
  tail_text=$(sed 's/\r$//' "$work/tty" | tr -d '\n' | awk -F'\r' '{print $NF}')
  if [[ $tail_text == *"[#"* || $tail_text == *"%"*"["* ]]; then
    fail "$name left its bar on the screen: $tail_text"
  fi
done

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "progress bars: all passed"
