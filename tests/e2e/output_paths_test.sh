#!/usr/bin/env bash
# No output ever replaces an input or a special file: every output flag of every tool is
# given, in turn, a path equal to each input of the run, /dev/null, a FIFO and a directory
# (docs/reliability.md, "Outputs and inputs").
#
#   | target        | expected                                                         |
#   |---------------|------------------------------------------------------------------|
#   | an input      | refused (exit 2) before any work, every input byte for byte kept |
#   | /dev/null     | written through (exit 0); /dev/null stays a character device     |
#   | a FIFO        | written through to a reader (exit 0); the FIFO stays a FIFO      |
#   | a directory   | refused (exit 3), the directory unchanged                        |
#
# --checkpoint-dir wants a directory: there an input, /dev/null and a FIFO are refused
# (exit 3) and a directory is used. --svg takes a prefix: PREFIX-pipeline.svg and
# PREFIX-pairing.svg never equal an input, so every prefix is written beside it (exit 0;
# a directory as prefix writes DIR-pipeline.svg next to DIR). dhelix-diff writes nothing but
# its standard output. After every run every input is compared with its saved checksum.
#
# Usage: output_paths_test.sh BIN_DIR SOURCE_DIR
set -u
bin=$(cd "${1:?usage: output_paths_test.sh BIN_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: output_paths_test.sh BIN_DIR SOURCE_DIR}" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
reader=""
cleanup() {
  [[ -n $reader ]] && kill "$reader" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work" || exit 1

passed=0
failed=0
pass() { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)); echo "FAIL  $1: $2"; }

# --- the inputs: a one-rank tiny job, its model and cluster, a profile, a plan, data ----------
mkdir models clusters jobs
cp "$src/examples/models/llama-tiny.json" models/
cp "$src/examples/clusters/cpu-host.json" clusters/
sed -e 's/"tp": 2/"tp": 1/' -e 's/"sp": true/"sp": false/' "$src/examples/jobs/tiny-tp2.json" >jobs/job.json
head -c 200000 "$src/examples/data/corpus.txt" >corpus.txt
"$bin/dhelix-profile" jobs/job.json -o profile.json >/dev/null 2>&1 || fail setup "profile"
"$bin/dhelix-plan" jobs/job.json --profile profile.json -o plan.json >/dev/null 2>&1 ||
  fail setup "plan"
printf '{"step": 1, "loss": 5.5, "loss_bits": "0x40b00000"}\n' >loss.log
mkfifo pipe
mkdir folder
touch folder/keep
inputs=(jobs/job.json models/llama-tiny.json clusters/cpu-host.json profile.json plan.json
  corpus.txt loss.log)
sha256sum "${inputs[@]}" >inputs.sha256

# What a target path is now: "char", "fifo", "dir:<listing>", or a checksum.
state() {
  if [[ -c $1 ]]; then
    echo char
  elif [[ -p $1 ]]; then
    echo fifo
  elif [[ -d $1 ]]; then
    echo "dir:$(ls -A "$1" | tr '\n' ' ')"
  elif [[ ! -e $1 ]]; then
    echo missing
  else
    sha256sum <"$1"
  fi
}

# Runs one case: try TOOL FLAG TARGET EXPECTED_STATUS ARGS... (the output flag and target
# are appended). With a FIFO target a reader collects what is written.
try() {
  local name=$1 flag=$2 target=$3 expected=$4
  shift 4
  local before
  before=$(state "$target")
  [[ $flag == --loss-log && -f $target ]] && cp "$target" appended.before
  rm -f fifo.out
  if [[ $target == pipe ]]; then
    cat pipe >fifo.out &
    reader=$!
  fi
  timeout 120 "$@" "$flag" "$target" >out.txt 2>err.txt
  local status=$?
  if [[ -n $reader ]]; then
    # A tool that refused the FIFO never opened it: release the waiting reader.
    if ((status != 0)); then kill "$reader" 2>/dev/null; fi
    wait "$reader" 2>/dev/null
    reader=""
  fi
  local label="$name $flag $target"
  if [[ -f appended.before ]]; then
    # A loss log is appended to: what it held must still be there, first.
    if cmp -s -n "$(stat -c %s appended.before)" appended.before "$target"; then
      sha256sum "${inputs[@]}" >inputs.sha256
    fi
    rm -f appended.before
  fi
  if [[ $status != "$expected" ]]; then
    fail "$label" "exit $status, expected $expected: $(head -c 300 err.txt)"
  elif ! sha256sum --quiet -c inputs.sha256 >/dev/null 2>&1; then
    fail "$label" "an input changed: $(sha256sum --quiet -c inputs.sha256 2>&1 | head -3)"
    sha256sum "${inputs[@]}" >inputs.sha256
  elif [[ $target == /dev/null || $target == pipe || $target == folder ]] &&
    [[ $(state "$target") != "$before" && $target != folder ]]; then
    fail "$label" "$target is now $(state "$target"), was $before"
  elif [[ $target == folder && $flag != --checkpoint-dir && $(state folder) != "$before" ]]; then
    fail "$label" "the directory changed: $(state folder)"
  elif [[ $target == pipe && $expected == 0 && ! -s fifo.out && $flag != --svg ]]; then
    fail "$label" "nothing came through the FIFO"
  else
    pass
  fi
}

plan_cmd=("$bin/dhelix-plan" jobs/job.json --profile profile.json)
profile_cmd=("$bin/dhelix-profile" jobs/job.json)
run_cmd=("$bin/dhelix-run" --plan plan.json --job jobs/job.json --data corpus.txt --steps 1
  --no-progress)

# --- 1. every output flag against every input of its command: refused, nothing changed -----
plan_inputs=(jobs/job.json models/llama-tiny.json clusters/cpu-host.json profile.json)
for input in "${plan_inputs[@]}"; do
  try dhelix-plan -o "$input" 2 "${plan_cmd[@]}"
  try dhelix-plan --trace "$input" 2 "${plan_cmd[@]}"
  try dhelix-plan --svg "$input" 0 "${plan_cmd[@]}"  # writes INPUT-pipeline.svg beside it
done
for input in jobs/job.json models/llama-tiny.json clusters/cpu-host.json; do
  try dhelix-profile -o "$input" 2 "${profile_cmd[@]}"
done
for input in plan.json jobs/job.json corpus.txt; do
  try dhelix-run --loss-log "$input" 2 "${run_cmd[@]}"
  try dhelix-run --checkpoint-dir "$input" 3 "${run_cmd[@]}"
done
try dhelix-run --loss-log loss.log 0 "${run_cmd[@]}"  # a loss log is appended to
[[ $(wc -l <loss.log) -eq 2 ]] || fail "--loss-log loss.log" "the old line was not kept"
rm -f ./*-pipeline.svg ./*-pairing.svg jobs/*.svg models/*.svg clusters/*.svg

# --- 2. /dev/null, a FIFO, a directory ---------------------------------------------------------
for target in /dev/null pipe folder; do
  ok=0
  [[ $target == folder ]] && ok=3
  try dhelix-plan -o "$target" "$ok" "${plan_cmd[@]}"
  try dhelix-plan --trace "$target" "$ok" "${plan_cmd[@]}"
  try dhelix-profile -o "$target" "$ok" "${profile_cmd[@]}"
  try dhelix-run --loss-log "$target" "$ok" "${run_cmd[@]}"
  if [[ $target == folder ]]; then
    try dhelix-run --checkpoint-dir "$target" 0 "${run_cmd[@]}"
  else
    try dhelix-run --checkpoint-dir "$target" 3 "${run_cmd[@]}"
  fi
done
try dhelix-plan --svg folder 0 "${plan_cmd[@]}"
[[ -f folder-pipeline.svg && -f folder-pairing.svg ]] || fail "--svg folder" "no folder-*.svg"

# --- 3. two outputs of one run on one file -------------------------------------------------------
try dhelix-plan --trace x.json 2 "${plan_cmd[@]}" -o x.json
[[ ! -e x.json ]] || fail "-o x.json --trace x.json" "x.json was written"

# --- 4. dhelix-diff has no output flag: its inputs stay as they were -------------------------------
"$bin/dhelix-diff" plan.json plan.json >/dev/null 2>&1 || fail dhelix-diff "exit $?"
sha256sum --quiet -c inputs.sha256 >/dev/null 2>&1 || fail dhelix-diff "an input changed"

echo "$passed passed, $failed failed"
((failed == 0))
