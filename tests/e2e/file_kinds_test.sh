#!/usr/bin/env bash
# Files given where a file is expected (docs/reliability.md, "Hardening 3: files given where
# a file is expected"). Every file input and every file output of the four tools, from the
# table below, is given each kind of thing that is not a plain file:
#
#   | kind               | an input (JOB, --plan, ...)        | an output (-o, --trace, ...)      |
#   |--------------------|------------------------------------|-----------------------------------|
#   | a directory        | exit 3 "is a directory"            | exit 3, the directory unchanged   |
#   | a FIFO, no process | exit 3 "FIFO" at once (it hung     | exit 3 "FIFO" after 2 s; it stays |
#   | at the other end   | in open(2))                        | a FIFO (--loss-log hung)          |
#   | /dev/zero          | exit 3 "character device"          |                                   |
#   | a dangling link    |                                    | exit 0: the file it points at     |
#   |                    |                                    | written, the link kept (it was    |
#   |                    |                                    | replaced by a regular file)       |
#   | a link to a file   |                                    | exit 0: that file rewritten, the  |
#   |                    |                                    | link kept                         |
#   | a 0444 file        |                                    | exit 3 "is read-only": content    |
#   |                    |                                    | and mode unchanged (it was        |
#   |                    |                                    | replaced, and became 0644)        |
#
# Each run has a time limit: a hang is a failure, not a stuck test. The table is checked
# against every tool's --help: an option missing from it (a new one) fails the test until it
# is placed, as a file option (tried here) or one that names no file. --checkpoint-dir (a
# directory) is tried by tests/e2e/output_paths_test.sh and the checkpoint tests. /dev/null
# and a FIFO with a reader as outputs are written through (tests/e2e/output_paths_test.sh).
# dhelix-run runs a one-rank tiny job as an MPI singleton, then five cases under
# `mpirun -np 2` (tiny-tp2), where a hang or a refusal on one rank is the case that matters.
#
# Usage: file_kinds_test.sh BIN_DIR SOURCE_DIR
set -u
bin=$(cd "${1:?usage: file_kinds_test.sh BIN_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: file_kinds_test.sh BIN_DIR SOURCE_DIR}" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

# A run longer than this hung (a tiny job plans and trains in about a second).
limit=30
passed=0
failed=0
pass() { passed=$((passed + 1)); }
fail() {
  failed=$((failed + 1))
  echo "FAIL  $1: $2"
  [[ -s err.txt ]] && echo "      stderr: $(head -c 400 err.txt)"
}

# --- the table ------------------------------------------------------------------------------
# TOOL|OPTION|ROLE|COMMAND: ROLE is in, out or prefix (an output naming files PREFIX-*.svg);
# @ in COMMAND stands for the path tried. Paths hold no spaces (the command is split on them).
run_args="--data corpus.txt --steps 1 --no-progress"
files="
dhelix-plan|JOB|in|dhelix-plan @
dhelix-plan|--model|in|dhelix-plan jobs/job.json --model @
dhelix-plan|--cluster|in|dhelix-plan jobs/job.json --cluster @
dhelix-plan|--profile|in|dhelix-plan jobs/job.json --profile @
dhelix-plan|--check|in|dhelix-plan --check @
dhelix-plan|-o|out|dhelix-plan jobs/job.json --profile profile.json -o @
dhelix-plan|--trace|out|dhelix-plan jobs/job.json --profile profile.json --trace @
dhelix-plan|--svg|prefix|dhelix-plan jobs/job.json --profile profile.json --svg @
dhelix-plan dag|JOB|in|dhelix-plan dag @
dhelix-plan dag|--model|in|dhelix-plan dag jobs/job.json --model @
dhelix-plan dag|--cluster|in|dhelix-plan dag jobs/job.json --cluster @
dhelix-profile|JOB|in|dhelix-profile @ -o new.json
dhelix-profile|--model|in|dhelix-profile jobs/job.json --model @ -o new.json
dhelix-profile|--cluster|in|dhelix-profile jobs/job.json --cluster @ -o new.json
dhelix-profile|--from-trace|in|dhelix-profile jobs/job.json --from-trace @ --base profile.json -o new.json
dhelix-profile|--base|in|dhelix-profile jobs/job.json --from-trace trace.json --base @ -o new.json
dhelix-profile|-o|out|dhelix-profile jobs/job.json -o @
dhelix-run|--plan|in|dhelix-run --plan @ $run_args
dhelix-run|--job|in|dhelix-run --plan plan.json --job @ $run_args
dhelix-run|--data|in|dhelix-run --plan plan.json --data @ --steps 1 --no-progress
dhelix-run|--loss-log|out|dhelix-run --plan plan.json $run_args --loss-log @
dhelix-run|--trace|out|dhelix-run --plan plan.json $run_args --trace @
dhelix-diff|A|in|dhelix-diff @ plan.json
dhelix-diff|B|in|dhelix-diff plan.json @
dhelix-diff|--measured|in|dhelix-diff plan.json --measured @
"
# Options that name no file, and --checkpoint-dir (a directory, tried elsewhere).
others="
dhelix-plan|--help --version --report --allow-oom --shape --no-split-backward --json --validate-only --search --gpus --max-pp --no-cp --no-recompute-search --all-schemes --top --threads --virtual-pipeline-model-parallel-size --num-layers-per-virtual-pipeline-stage
dhelix-plan dag|--help --format
dhelix-profile|--help --version --backend --list --samples --warmup --blas-threads --max-samples --emulate-link --warm-caches
dhelix-run|--help --version --data-format --steps --checkpoint-dir --checkpoint-every --resume --seed --lr --weight-decay --verify --sequential --no-check --jitter-us --backend --ddp-bucket-size --overlap-grad-reduce --no-overlap-grad-reduce --distributed-optimizer --no-distributed-optimizer --overlap-param-gather --no-overlap-param-gather --blas-threads --no-progress --comm-wait --comm-max-sleep-us --pin-compute --emulate-link --watchdog-s
dhelix-diff|--help --version --fail-if-off --json --fail-if-slower --fail-if-changed
"
# The job options every tool with a JOB shares (tools/job_cli.h) name no file but these.
job_settings="--dp --tp --pp --cp --ep --sp --no-sp --mbs --gbs --seq --rank-order
--recompute-granularity --recompute-method --recompute-num-layers
--decoder-first-pipeline-num-layers --decoder-last-pipeline-num-layers
--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split
--expert-tensor-parallel-size --moe-load-imbalance --overlap-grad-reduce
--no-overlap-grad-reduce --overlap-param-gather --no-overlap-param-gather
--grad-reduce-in-bf16 --cp-comm-type --hierarchical-context-parallel-sizes
--use-megatron-fsdp --data-parallel-sharding-strategy --fsdp-reshard-after-forward
--no-fsdp-reshard-after-forward"

# --- the inputs: a one-rank tiny job, its model and cluster, a profile, a plan, a trace -------
mkdir models clusters jobs kinds
cp "$src/examples/models/llama-tiny.json" models/
cp "$src/examples/clusters/cpu-host.json" clusters/
sed -e 's/"tp": 2/"tp": 1/' -e 's/"sp": true/"sp": false/' "$src/examples/jobs/tiny-tp2.json" >jobs/job.json
head -c 200000 "$src/examples/data/corpus.txt" >corpus.txt
setup() { "$@" >setup.txt 2>&1 || { echo "setup failed: $*"; cat setup.txt; exit 1; }; }
setup "$bin/dhelix-profile" jobs/job.json -o profile.json
setup "$bin/dhelix-plan" jobs/job.json --profile profile.json -o plan.json
setup "$bin/dhelix-run" --plan plan.json --data corpus.txt --steps 1 --no-progress --trace trace.json
mkdir kinds/dir.json
touch kinds/dir.json/keep
mkfifo kinds/fifo.json
old_line='{"step": 1, "loss": 5.5, "loss_bits": "0x40b00000"}'

# --- 1. the table covers every option of every --help -----------------------------------------
# Prints the names of each option, positional and subcommand a --help lists, one entry per
# line ("-o,--output"; a subcommand as "subcommand:dag").
help_entries() {
  # shellcheck disable=SC2086 # "dhelix-plan dag": the tool and its subcommand
  timeout "$limit" "$bin"/$1 --help 2>&1 | awk '
    /^[A-Za-z ]+:$/ { section = toupper($0); next }
    section ~ /^(POSITIONALS|OPTIONS):$/ && /^  [^ ]/ { print $1 }
    section == "SUBCOMMANDS:" && /^  [^ ]/ { print "subcommand:" $1 }'
}
# known TOOL NAME: NAME is an option of TOOL in the table (its OPTION field, or its list of
# other options).
known() {
  local tool=$1 name=$2 row_tool option
  while IFS='|' read -r row_tool option _; do
    [[ $row_tool == "$tool" && $option == "$name" ]] && return 0
  done <<<"$files"
  while IFS='|' read -r row_tool option; do
    [[ $row_tool == "$tool" && " $option " == *" $name "* ]] && return 0
  done <<<"$others"
  [[ $tool != dhelix-diff && $tool != dhelix-run && " ${job_settings//$'\n'/ } " == *" $name "* ]]
}
tools=(dhelix-plan dhelix-profile dhelix-run dhelix-diff)
for ((t = 0; t < ${#tools[@]}; t++)); do
  tool=${tools[t]}
  entries=$(help_entries "$tool")
  [[ -n $entries ]] || fail "$tool --help" "no options found in its --help"
  for entry in $entries; do
    if [[ $entry == subcommand:* ]]; then
      tools+=("$tool ${entry#subcommand:}")  # its own --help is checked in turn
      continue
    fi
    found=0
    IFS=',' read -ra names <<<"$entry"
    for name in "${names[@]}"; do
      name=${name%%\{*}  # --overlap-grad-reduce{false}
      known "$tool" "$name" && found=1
    done
    if ((found)); then pass; else fail "$tool $entry" "not in this test's table: place it"; fi
  done
done
[[ " ${tools[*]} " == *" dhelix-plan dag "* ]] || fail "dhelix-plan --help" "no subcommand dag"

# --- 2. runs ------------------------------------------------------------------------------------
status=0
# run_case COMMAND PATH: runs COMMAND of the table with @ replaced by PATH.
run_case() {
  local command=${1//@/$2}
  # shellcheck disable=SC2086 # the table's commands are split on spaces on purpose
  set -- $command
  local tool=$1
  shift
  timeout -k 5 "$limit" "$bin/$tool" "$@" >out.txt 2>err.txt
  status=$?
}
# check_status LABEL WANT: fails on a hang or another exit status.
check_status() {
  if ((status == 124 || status == 137)); then
    fail "$1" "hung: killed after $limit s"
  elif ((status != $2)); then
    fail "$1" "exit $status, expected $2"
  else
    return 0
  fi
  return 1
}
# message_has LABEL TEXT...: stderr holds every TEXT.
message_has() {
  local label=$1 text
  shift
  for text in "$@"; do
    grep -qF -- "$text" err.txt || { fail "$label" "the message lacks \"$text\""; return 1; }
  done
}

inputs_tried=0
try_input() {
  local tool=$1 option=$2 command=$3 kind path word
  for kind in directory FIFO device; do
    case $kind in
      directory) path=kinds/dir.json word="is a directory" ;;
      FIFO) path=kinds/fifo.json word=FIFO ;;
      device) path=/dev/zero word=device ;;
    esac
    inputs_tried=$((inputs_tried + 1))
    run_case "$command" "$path"
    local label="$tool $option <$kind>"
    check_status "$label" 3 || continue
    message_has "$label" "$path: " "$word" || continue
    if [[ ! -p kinds/fifo.json || ! -f kinds/dir.json/keep ]]; then
      fail "$label" "the FIFO or the directory changed"
      continue
    fi
    pass
  done
}

outputs_tried=0
case_number=0
try_output() {
  local tool=$1 option=$2 role=$3 command=$4 kind
  for kind in directory FIFO dangling-link link read-only; do
    case_number=$((case_number + 1))
    outputs_tried=$((outputs_tried + 1))
    local base=kinds/out${case_number}_ dest=dest$case_number.json
    # The file the option makes the tool write, and the argument that names it.
    local target=$base.json arg=$base.json
    [[ $role == prefix ]] && target=$base-pipeline.svg arg=$base
    case $kind in
      directory) mkdir "$target" && touch "$target/keep" ;;
      FIFO) mkfifo "$target" ;;
      dangling-link) ln -s "$dest" "$target" ;;
      link) echo "$old_line" >"kinds/$dest" && ln -s "$dest" "$target" ;;
      read-only) echo "$old_line" >"$target" && chmod 0444 "$target" ;;
    esac
    run_case "$command" "$arg"
    local label="$tool $option <$kind>"
    case $kind in
      directory)
        check_status "$label" 3 || continue
        message_has "$label" "$target" "is a directory" || continue
        [[ $(ls -A "$target") == keep ]] || { fail "$label" "the directory changed"; continue; }
        ;;
      FIFO)
        check_status "$label" 3 || continue
        message_has "$label" "$target" "FIFO" || continue
        [[ -p $target ]] || { fail "$label" "the FIFO was replaced"; continue; }
        ;;
      dangling-link | link)
        check_status "$label" 0 || continue
        if [[ ! -L $target || $(readlink "$target") != "$dest" ]]; then
          fail "$label" "the link was replaced"
          continue
        fi
        if [[ ! -s kinds/$dest || $(cat "kinds/$dest") == "$old_line" ]]; then
          fail "$label" "the file the link points at was not written"
          continue
        fi
        ;;
      read-only)
        check_status "$label" 3 || continue
        message_has "$label" "$target" "is read-only; dhelix does not overwrite a file without write permission" ||
          continue
        if [[ $(cat "$target") != "$old_line" || $(stat -c %a "$target") != 444 ]]; then
          fail "$label" "the file changed: mode $(stat -c %a "$target")"
          continue
        fi
        ;;
    esac
    # A refused command writes nothing: no other picture of --svg, no temporary file.
    if ((status != 0)) && compgen -G "$base*" | grep -qv "^$target\$"; then
      fail "$label" "something was written: $(compgen -G "$base*" | tr '\n' ' ')"
      continue
    fi
    if compgen -G "kinds/*.tmp.*" >/dev/null; then
      fail "$label" "a temporary file was left: $(compgen -G "kinds/*.tmp.*")"
      rm -f kinds/*.tmp.*
      continue
    fi
    pass
  done
}

while IFS='|' read -r tool option role command; do
  [[ -n $tool ]] || continue
  if [[ $role == in ]]; then
    try_input "$tool" "$option" "$command"
  else
    try_output "$tool" "$option" "$role" "$command"
  fi
done <<<"$files"

# --- 3. dhelix-run under mpirun, two ranks (tiny-tp2): every rank stops, none waits ------------
setup "$bin/dhelix-plan" "$src/examples/jobs/tiny-tp2.json" -o plan2.json
mpi_runs=0
ln -s dest-mpi.json kinds/mpi-trace.json
try_mpi() {
  local label="mpirun -np 2 dhelix-run $1 <$2>" want=$3 option=$1 path=$4
  local plan=(--plan plan2.json)
  [[ $option == --plan ]] && plan=()
  mpi_runs=$((mpi_runs + 1))
  timeout -k 5 "$limit" mpirun --allow-run-as-root --oversubscribe -np 2 "$bin/dhelix-run" \
    "${plan[@]}" --data corpus.txt --steps 1 --no-progress "$option" "$path" >out.txt 2>err.txt
  status=$?
  check_status "$label" "$want" || return
  if ((want == 0)); then
    [[ -L $path && -s kinds/dest-mpi.json ]] || { fail "$label" "link replaced or target empty"; return; }
  else
    message_has "$label" "$path: " "$5" || return
  fi
  pass
}
echo "$old_line" >kinds/mpi-read-only.log
chmod 0444 kinds/mpi-read-only.log
try_mpi --plan FIFO 3 kinds/fifo.json FIFO
try_mpi --loss-log FIFO 3 kinds/fifo.json "is a FIFO that no process is reading"
try_mpi --loss-log read-only 3 kinds/mpi-read-only.log "is read-only"
try_mpi --trace read-only 3 kinds/mpi-read-only.log "is read-only"
try_mpi --trace dangling-link 0 kinds/mpi-trace.json ""
[[ $(cat kinds/mpi-read-only.log) == "$old_line" ]] || fail "mpirun read-only" "the file changed"

echo "inputs: $inputs_tried runs (file options x directory, FIFO, device);" \
  "outputs: $outputs_tried runs (file options x directory, FIFO, dangling link, link, read-only);" \
  "mpirun -np 2: $mpi_runs runs"
echo "$passed passed, $failed failed"
((failed == 0))
