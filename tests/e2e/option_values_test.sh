#!/usr/bin/env bash
# Every option of every tool that takes a value, given the values people mistype: an empty
# string for every option (a file, a name, a number: '' must never read as "not given"),
# and for every integer option 0, -1, 2^63 - 1, 2^63, 2^64 and 10^20 (never clamped, never
# passed on to code that allocates). The options are read from each tool's --help, so a
# new option is covered without editing this test.
#
# Each case must exit 2 with a message that names the option (one of its spellings), and,
# for a number, the value typed; print no "internal error" and no CLI11 309-digit bound;
# and write nothing: the command's outputs point into an empty folder checked after the run.
# The placeholder of every option taking a whole number is N (no INT, UINT, TEXT, FLOAT).
# docs/reliability.md, "Hardening 3: command-line values", records the counts.
#
# Usage: option_values_test.sh BIN_DIR SOURCE_DIR
set -u
bin=$(cd "${1:?usage: option_values_test.sh BIN_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: option_values_test.sh BIN_DIR SOURCE_DIR}" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

passed=0
failed=0
fail() {
  failed=$((failed + 1))
  echo "FAIL  $1: $2"
  echo "      stderr: $(head -c 400 stderr.txt)"
}

# --- a one-rank tiny job, its plan and a corpus (as tests/e2e/reliability_test.sh) ---------
mkdir -p out
sed -e 's/"tp": 2/"tp": 1/' -e 's/"sp": true/"sp": false/' -e 's|\.\./|'"$src"'/examples/|g' \
  "$src/examples/jobs/tiny-tp2.json" >job.json
head -c 100000 "$src/examples/data/corpus.txt" >corpus.txt
"$bin/dhelix-plan" job.json -o plan.json >/dev/null || { echo "setup: planning failed"; exit 1; }

# Options where a value of the families is legal, with the reason. Key: "tool option value".
declare -A legal=(
  ["dhelix-run --seed 0"]="a seed is any 64-bit unsigned value"
  ["dhelix-run --seed 9223372036854775807"]="a seed is any 64-bit unsigned value"
  ["dhelix-run --seed 9223372036854775808"]="a seed is any 64-bit unsigned value"
  ["dhelix-run --checkpoint-every 0"]="0: a checkpoint only after the last step"
  ["dhelix-run --jitter-us 0"]="0: no jitter (the default)"
  ["dhelix-profile --warmup 0"]="0: no untimed runs"
)
int_values=(0 -1 9223372036854775807 9223372036854775808 18446744073709551616 100000000000000000000)

# options TOOL [SUBCOMMAND]: "KIND NAMES TYPE" per option taking a value, from --help (TYPE:
# the placeholder without its checks and default);
# KIND is int (placeholder N, or CLI11's INT / UINT / K / V of older builds) or str (anything
# else: a file, a name, a real number). Flags (no placeholder) are left out.
options() {
  "$bin/$1" ${2:+"$2"} --help 2>/dev/null | python3 -c '
import re, sys
# CLI11 pads "  NAMES TYPE" to 30 columns and starts the description there, or on the next
# line when the names are longer.
section = None
lines = sys.stdin.read().splitlines() + [""]
for i, line in enumerate(lines[:-1]):
    if line.startswith(("Positionals:", "Options:")):
        section = line
        continue
    if not line.startswith("  ") or line.startswith("   ") or section is None:
        if line and not line.startswith(" "):
            section = None
        continue
    alone = lines[i + 1].startswith(" " * 30) or len(line) <= 30
    parts = (line if alone else line[:30]).split()
    names, placeholder = parts[0], parts[1] if len(parts) > 1 else ""
    if placeholder in ("", "Excludes:", "Needs:", "REQUIRED") or placeholder.startswith("["):
        continue
    head = re.split(r"[:=]", placeholder)[0]  # N:POSITIVE, N=5: the type before checks
    kind = "int" if head in ("N", "K", "V") or re.search(r"\bU?INT\b", placeholder) else "str"
    print(kind, names, head)
'
}

# The command each tool runs around the option tried: every output it can write points into
# out/, so "nothing written" is one check. ARGS ends without the option.
base_command() {
  local tool=$1 sub=$2 option=$3 search_only=$4
  case $tool$sub in
    dhelix-plan) cmd=("$bin/dhelix-plan" job.json -o out/plan.json --trace out/trace.json)
      [[ $option == -o || $option == --trace ]] && cmd=("$bin/dhelix-plan" job.json)
      [[ $search_only == 1 ]] && cmd=("$bin/dhelix-plan" job.json --search -o out/best.json) ;;
    dhelix-plandag) cmd=("$bin/dhelix-plan" dag job.json) ;;
    dhelix-profile) cmd=("$bin/dhelix-profile" job.json -o out/profile.json)
      [[ $option == -o ]] && cmd=("$bin/dhelix-profile" job.json) ;;
    dhelix-run) cmd=("$bin/dhelix-run" --plan plan.json --data corpus.txt --steps 1 --no-progress
      --loss-log out/loss.jsonl --checkpoint-dir out/ck)
      case $option in
        --plan) cmd=("$bin/dhelix-run" --data corpus.txt --steps 1 --no-progress) ;;
        --data) cmd=("$bin/dhelix-run" --plan plan.json --steps 1 --no-progress) ;;
        --steps) cmd=("$bin/dhelix-run" --plan plan.json --data corpus.txt --no-progress) ;;
        --loss-log | --checkpoint-dir)
          cmd=("$bin/dhelix-run" --plan plan.json --data corpus.txt --steps 1 --no-progress) ;;
      esac ;;
    dhelix-diff) cmd=("$bin/dhelix-diff" plan.json plan.json) ;;
  esac
}

# try TOOL SUB KIND NAMES VALUE SEARCH_ONLY
try() {
  local tool=$1 sub=$2 kind=$3 names=$4 value=$5 search_only=$6
  local option=${names%%,*} label
  label="$tool${sub:+ $sub} $option '$value'"
  base_command "$tool" "$sub" "$option" "$search_only"
  rm -rf out && mkdir out
  if [[ $option == -* ]]; then
    timeout 120 "${cmd[@]}" "$option" "$value" >stdout.txt 2>stderr.txt
  elif [[ $tool == dhelix-diff ]]; then  # A or B: the other one stays a plan
    local a=plan.json b=plan.json
    [[ $option == A ]] && a=$value
    [[ $option == B ]] && b=$value
    timeout 120 "$bin/dhelix-diff" "$a" "$b" >stdout.txt 2>stderr.txt
  else  # JOB: in place of the job file
    local args=()
    for word in "${cmd[@]}"; do [[ $word == job.json ]] && args+=("$value") || args+=("$word"); done
    timeout 120 "${args[@]}" >stdout.txt 2>stderr.txt
  fi
  local status=$?
  local named=0 spelling
  for spelling in ${names//,/ }; do
    grep -qF -- "$spelling:" stderr.txt && named=1
  done
  if [[ $status -ne 2 ]]; then
    fail "$label" "exit status $status, expected 2"
  elif [[ $named -eq 0 ]]; then
    fail "$label" "the message does not name $names"
  elif [[ $kind == int ]] && ! grep -qF -- "$value" stderr.txt; then
    fail "$label" "the message does not repeat the value"
  elif [[ $kind == str ]] && ! grep -q "empty" stderr.txt; then
    fail "$label" "the message does not say the value is empty"
  elif grep -q "internal error" stderr.txt; then
    fail "$label" "internal error"
  elif grep -qE "[0-9]{30,}" stderr.txt; then
    fail "$label" "a CLI11 309-digit bound"
  elif [[ -n $(find out -mindepth 1 -print -quit) ]]; then
    fail "$label" "wrote $(find out -mindepth 1 | tr '\n' ' ')"
  else
    passed=$((passed + 1))
  fi
}

tried=0
for target in "dhelix-plan" "dhelix-plan dag" "dhelix-profile" "dhelix-run" "dhelix-diff"; do
  read -r tool sub <<<"$target"
  help=$("$bin/$tool" ${sub:+"$sub"} --help 2>&1)
  # Search-only options are tried with --search, where their values reach the search.
  search_only_names=$(grep -E "^ +--[a-z-]+ .*With --search" <<<"$help" | awk '{print $1}')
  count=0
  ints=0
  before=$tried
  while read -r kind names placeholder; do
    [[ -z $kind ]] && continue
    count=$((count + 1))
    [[ $kind == int ]] && ints=$((ints + 1))
    option=${names%%,*}
    search_only=0
    grep -qxF -- "$option" <<<"$search_only_names" && search_only=1
    if [[ $kind == int && $placeholder != N ]]; then
      failed=$((failed + 1))
      echo "FAIL  $target $option: placeholder $placeholder, expected N (a whole number)"
    fi
    try "$tool" "$sub" "$kind" "$names" "" "$search_only"
    tried=$((tried + 1))
    [[ $kind == int ]] || continue
    for value in "${int_values[@]}"; do
      [[ -n ${legal["$tool $option $value"]:-} ]] && continue
      try "$tool" "$sub" int "$names" "$value" "$search_only"
      tried=$((tried + 1))
    done
  done < <(options "$tool" "$sub")
  [[ $count -gt 0 ]] || { failed=$((failed + 1)); echo "FAIL  $target: no option read from --help"; }
  echo "$target: $count options taking a value ($ints integer), $((tried - before)) cases"
  # Every placeholder is named (N, FILE, ...), never CLI11's generic type names.
  generic=$(grep -E "^ +-[^ ]* [^ ]*\b(INT|UINT|FLOAT|TEXT|POSITIVE|NONNEGATIVE)\b" <<<"$help")
  if [[ -n $generic ]]; then
    failed=$((failed + 1))
    echo "FAIL  $target --help: CLI11's type names on $(wc -l <<<"$generic") options: $generic"
  fi
done

echo "$tried cases tried: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
