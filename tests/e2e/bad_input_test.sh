#!/usr/bin/env bash
# Bad input files, end to end: every reader of every tool gets truncated files, wrong
# types, huge and negative numbers, NaN, unknown keys, another schema major version,
# mismatched provenance, 200000 nested arrays, a missing file, a directory, an empty file
# and binary garbage.
# Each must end in a clear error (`<tool>: error: ...`) with the documented exit status,
# never a crash, and must leave no output file (not even a temporary one) behind.
# docs/reliability.md holds the table this test checks.
#
# Usage: bad_input_test.sh <dir-with-binaries> <source-dir> [--table]
#   --table: print the observed results as the Markdown rows of docs/reliability.md
#            instead of checking them.
set -u

bin_dir=$(cd "$1" && pwd)
src_dir=$(cd "$2" && pwd)
table_mode=0
[[ ${3:-} == --table ]] && table_mode=1
examples="$src_dir/examples"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
bad="$scratch/bad"
mkdir -p "$bad"

passed=0
failed=0

# --- good inputs, each reader's starting point ---------------------------------------
good="$scratch/good"
mkdir -p "$good"
cp "$examples/models/llama-8b.json" "$good/model.json"
cp "$examples/models/hf/llama-3-8b.config.json" "$good/hf.json"
cp "$examples/clusters/a40.json" "$good/cluster.json"
cp "$examples/plans/golden/llama-8b-a40.plan.json" "$good/plan.json"
# Absolute paths, so that the bad copies of the job in bad/ still find their model.
sed -e "s|\"\\.\\./models/llama-8b\\.json\"|\"$good/model.json\"|" \
  -e "s|\"cluster\": \"a40\"|\"cluster\": \"$good/cluster.json\"|" \
  "$examples/jobs/llama-8b-a40-dp16-tp4.json" >"$good/job.json"
if ! "$bin_dir/dhelix-profile" "$good/job.json" -o "$good/profile.json" 2>"$scratch/err"; then
  echo "FAIL  setup: dhelix-profile on the good job: $(cat "$scratch/err")"
  exit 1
fi
# A profile made for another job: the same model and parallel settings on the H100 cluster.
sed "s|\"cluster\": \"$good/cluster.json\"|\"cluster\": \"h100\"|" "$good/job.json" >"$good/job-h100.json"
"$bin_dir/dhelix-profile" "$good/job-h100.json" -o "$good/profile-h100.json" 2>/dev/null

# --- bad inputs: bad/<reader>-<kind>.json ---------------------------------------------
# Each reader has one integer field (and one real field for NaN and infinities) that the
# JSON edits target; the edits go through Python's json module so that only that field
# changes. NaN and Infinity are not JSON, so those files are refused by the parser.
/usr/bin/python3 - "$good" "$bad" <<'PY'
import json, sys
good, bad = sys.argv[1], sys.argv[2]
# reader: (file, path to an integer field, path to a real field or None)
readers = {
    "job": ("job.json", ["parallel", "tp"], None),
    "model": ("model.json", ["hidden_size"], None),
    "hf": ("hf.json", ["hidden_size"], ["rms_norm_eps"]),
    "cluster": ("cluster.json", ["gpus_per_node"], ["gpu", "peak_bf16_tflops"]),
    "profile": ("profile.json", ["ops", 0, "samples"], ["ops", 0, "time_us", "median"]),
    "plan": ("plan.json", ["num_micro_batches"], ["schemes", 0, "iteration_us"]),
}

def at(doc, path):
    for key in path[:-1]:
        doc = doc[key]
    return doc, path[-1]

def write(name, text):
    with open(f"{bad}/{name}.json", "w") as f:
        f.write(text)

for reader, (file, int_path, real_path) in readers.items():
    text = open(f"{good}/{file}").read()
    doc = json.loads(text)
    def edited(path, value, raw=None):
        copy = json.loads(text)
        parent, key = at(copy, path)
        parent[key] = value if raw is None else "@RAW@"
        out = json.dumps(copy, indent=2)
        return out if raw is None else out.replace('"@RAW@"', raw)
    write(f"{reader}-truncated", text[: len(text) // 2])
    write(f"{reader}-wrong-type", edited(int_path, "4"))
    write(f"{reader}-huge-number", edited(int_path, None, "1e400"))
    write(f"{reader}-int64-max", edited(int_path, 9223372036854775807))
    write(f"{reader}-negative-size", edited(int_path, -4096))
    write(f"{reader}-nan", edited(real_path or int_path, None, "NaN"))
    with_unknown = json.loads(text)
    parent, _ = at(with_unknown, int_path)
    parent["tensor_paralel"] = 2
    write(f"{reader}-unknown-key", json.dumps(with_unknown, indent=2))
    if "schema_version" in doc:
        other = json.loads(text)
        other["schema_version"] = "2.0.0"
        write(f"{reader}-schema-major", json.dumps(other, indent=2))
    write(f"{reader}-deep", edited(int_path, None, "[" * 200000 + "]" * 200000))
    write(f"{reader}-empty", "")
    with open(f"{bad}/{reader}-garbage.json", "wb") as f:
        f.write(bytes((i * 167 + 13) % 256 for i in range(1024)))
# A plan whose recorded inputs do not match its own job: the model hash is another's.
plan = json.loads(open(f"{good}/plan.json").read())
plan["inputs"]["model"]["sha256"] = "0" * 64
write("plan-provenance", json.dumps(plan, indent=2))
PY
mkdir -p "$bad/directory.json"

# --- running one case -----------------------------------------------------------------
out_dir="$scratch/out"
mkdir -p "$out_dir"

# case NAME EXPECTED_STATUS FRAGMENT COMMAND...: runs COMMAND (which writes to
# $out_dir/out.json if it gets that far) and checks the status, that stderr holds
# FRAGMENT and an error line, and that nothing was written. Status 0 marks an input the
# tools accept by design: it must then run to the end.
case_() {
  local name=$1 want_status=$2 fragment=$3
  shift 3
  rm -rf "${out_dir:?}"/*
  "$@" >"$scratch/stdout" 2>"$scratch/stderr"
  local status=$?
  local err
  err=$(cat "$scratch/stderr")
  local leftovers
  leftovers=$(ls -A "$out_dir")
  if [[ $table_mode -eq 1 ]]; then
    local first
    first=$(head -n 1 "$scratch/stderr" | sed -e "s|$scratch/||g" -e 's/|/\\|/g')
    [[ $(wc -l <"$scratch/stderr") -gt 1 ]] && first="$first (+$(($(wc -l <"$scratch/stderr") - 1)) lines)"
    echo "| $name | $status | \`$first\` |${leftovers:+ LEFT: $leftovers}"
    return
  fi
  local why=""
  if [[ $status -ne $want_status ]]; then
    why="exit status $status, expected $want_status"
  elif [[ $want_status -eq 0 ]]; then
    # Accepted by design (see docs/reliability.md): then it must write a complete file.
    [[ $name == dhelix-diff* || -s $out_dir/out.json ]] || why="accepted but wrote no out.json"
  elif [[ $err != *"$fragment"* ]]; then
    why="stderr lacks: $fragment"
  elif [[ $err != *": error: "* ]]; then
    why="stderr has no '<tool>: error:' line"
  elif [[ -n $leftovers ]]; then
    why="left files behind: $leftovers"
  fi
  if [[ -z $why ]]; then
    passed=$((passed + 1))
    echo "ok    $name"
  else
    failed=$((failed + 1))
    echo "FAIL  $name: $why"
    echo "      stderr: ${err:0:600}"
  fi
}

plan_tool="$bin_dir/dhelix-plan"
profile_tool="$bin_dir/dhelix-profile"
diff_tool="$bin_dir/dhelix-diff"
out="$out_dir/out.json"

# The command that feeds a bad file to each reader, by tool.
run_reader() {
  local tool=$1 reader=$2 file=$3
  case $tool/$reader in
    plan/job) "$plan_tool" "$file" -o "$out" ;;
    plan/model | plan/hf) "$plan_tool" "$good/job.json" --model "$file" -o "$out" ;;
    plan/cluster) "$plan_tool" "$good/job.json" --cluster "$file" -o "$out" ;;
    plan/profile) "$plan_tool" "$good/job.json" --profile "$file" -o "$out" ;;
    profile/job) "$profile_tool" "$file" -o "$out" ;;
    profile/model | profile/hf) "$profile_tool" "$good/job.json" --model "$file" -o "$out" ;;
    profile/cluster) "$profile_tool" "$good/job.json" --cluster "$file" -o "$out" ;;
    diff/plan) "$diff_tool" "$file" "$good/plan.json" ;;
  esac
}

# Expected results: tool reader kind status fragment-of-the-message (the message without
# the file's folder and, for JSON syntax errors, its line:column). A truncated file's
# message ends with what the parser met at the cut (a key, a value, a string), which moves
# whenever the good file's content does, so only its stable start is expected. Status 0 with "-": the
# input is accepted by design (docs/reliability.md says why). `--table` prints what the
# tools do now, to compare with this list and docs/reliability.md.
while read -r tool reader kind status fragment; do
  [[ -z $tool || $tool == \#* ]] && continue
  case $kind in
    missing) file="$bad/does-not-exist.json" ;;
    directory) file="$bad/directory.json" ;;
    provenance)
      if [[ $reader == profile ]]; then file="$good/profile-h100.json"; else file="$bad/plan-provenance.json"; fi
      ;;
    *) file="$bad/$reader-$kind.json" ;;
  esac
  case_ "dhelix-$tool $reader $kind" "$status" "$fragment" run_reader "$tool" "$reader" "$file"
done <<'CASES'
plan job truncated 2 not valid JSON: syntax error while parsing
plan job wrong-type 2 job-wrong-type.json: /parallel/tp: "4" is string, expected an integer
plan job huge-number 2 job-huge-number.json: not valid JSON: number overflow parsing '1e400'
plan job int64-max 2 job-int64-max.json: /parallel/tp: 9223372036854775807 must be at most 1048576
plan job negative-size 2 job-negative-size.json: /parallel/tp: -4096 must be at least 1
plan job nan 2 not valid JSON: syntax error while parsing value - invalid literal
plan job unknown-key 2 job-unknown-key.json: /parallel/tensor_paralel: unknown key
plan job schema-major 5 job-schema-major.json: /schema_version: "2.0.0" has major version 2, this dhelix reads major version 1 only
plan job missing 3 does-not-exist.json: cannot open file for reading
plan job directory 3 directory.json: is a directory, expected a file
plan job empty 2 not valid JSON: syntax error while parsing value - unexpected end of input; expected '[', '{', or a literal
plan job garbage 2 not valid JSON: syntax error while parsing value - invalid literal
plan job deep 2 arrays and objects nest more than 512 deep
plan model truncated 2 not valid JSON: syntax error while parsing
plan model wrong-type 2 model-wrong-type.json: /hidden_size: "4" is string, expected an integer
plan model huge-number 2 model-huge-number.json: not valid JSON: number overflow parsing '1e400'
plan model int64-max 2 model-int64-max.json: /hidden_size: 9223372036854775807 must be at most 1048576
plan model negative-size 2 model-negative-size.json: /hidden_size: -4096 must be at least 1
plan model nan 2 not valid JSON: syntax error while parsing value - invalid literal
plan model unknown-key 2 model-unknown-key.json: /tensor_paralel: unknown key
plan model schema-major 5 model-schema-major.json: /schema_version: "2.0.0" has major version 2, this dhelix reads major version 1 only
plan model missing 3 does-not-exist.json: cannot open file for reading
plan model directory 3 directory.json: is a directory, expected a file
plan model empty 2 not valid JSON: syntax error while parsing value - unexpected end of input; expected '[', '{', or a literal
plan model garbage 2 not valid JSON: syntax error while parsing value - invalid literal
plan model deep 2 arrays and objects nest more than 512 deep
plan hf truncated 2 not valid JSON: syntax error while parsing
plan hf wrong-type 2 hf-wrong-type.json: /hidden_size: "4" is string, expected an integer
plan hf huge-number 2 hf-huge-number.json: not valid JSON: number overflow parsing '1e400'
plan hf int64-max 2 hf-int64-max.json: /hidden_size: 9223372036854775807 must be at most 1048576
plan hf negative-size 2 hf-negative-size.json: /hidden_size: -4096 must be at least 1
plan hf nan 2 not valid JSON: syntax error while parsing value - invalid literal
plan hf unknown-key 0 -
plan hf missing 3 does-not-exist.json: cannot open file for reading
plan hf directory 3 directory.json: is a directory, expected a file
plan hf empty 2 not valid JSON: syntax error while parsing value - unexpected end of input; expected '[', '{', or a literal
plan hf garbage 2 not valid JSON: syntax error while parsing value - invalid literal
plan hf deep 2 arrays and objects nest more than 512 deep
plan cluster truncated 2 not valid JSON: syntax error while parsing
plan cluster wrong-type 2 cluster-wrong-type.json: /gpus_per_node: "4" is string, expected an integer
plan cluster huge-number 2 cluster-huge-number.json: not valid JSON: number overflow parsing '1e400'
plan cluster int64-max 2 cluster-int64-max.json: /gpus_per_node: 9223372036854775807 must be at most 1048576
plan cluster negative-size 2 cluster-negative-size.json: /gpus_per_node: -4096 must be at least 1
plan cluster nan 2 not valid JSON: syntax error while parsing value - invalid literal
plan cluster unknown-key 2 cluster-unknown-key.json: /tensor_paralel: unknown key
plan cluster schema-major 5 cluster-schema-major.json: /schema_version: "2.0.0" has major version 2, this dhelix reads major version 1 only
plan cluster missing 3 does-not-exist.json: cannot open file for reading
plan cluster directory 3 directory.json: is a directory, expected a file
plan cluster empty 2 not valid JSON: syntax error while parsing value - unexpected end of input; expected '[', '{', or a literal
plan cluster garbage 2 not valid JSON: syntax error while parsing value - invalid literal
plan cluster deep 2 arrays and objects nest more than 512 deep
plan profile truncated 2 not valid JSON: syntax error while parsing
plan profile wrong-type 2 profile-wrong-type.json: /ops/0/samples: "4" is string, expected an integer
plan profile huge-number 2 profile-huge-number.json: not valid JSON: number overflow parsing '1e400'
plan profile int64-max 0 -
plan profile negative-size 2 profile-negative-size.json: /ops/0/samples: -4096 must be at least 1
plan profile nan 2 not valid JSON: syntax error while parsing value - invalid literal
plan profile unknown-key 2 profile-unknown-key.json: /ops/0/tensor_paralel: unknown key
plan profile schema-major 5 profile-schema-major.json: /schema_version: "2.0.0" has major version 2, this dhelix reads major version 1 only
plan profile provenance 2 /cluster/gpu/attention_efficiency: the profile was made for cluster h100 (GPU H100-SXM) with 0.32 there, but the job runs on a40 (GPU A40) with 0.5
plan profile missing 3 does-not-exist.json: cannot open file for reading
plan profile directory 3 directory.json: is a directory, expected a file
plan profile empty 2 not valid JSON: syntax error while parsing value - unexpected end of input; expected '[', '{', or a literal
plan profile garbage 2 not valid JSON: syntax error while parsing value - invalid literal
plan profile deep 2 arrays and objects nest more than 512 deep
profile job truncated 2 not valid JSON: syntax error while parsing
profile job wrong-type 2 job-wrong-type.json: /parallel/tp: "4" is string, expected an integer
profile job huge-number 2 job-huge-number.json: not valid JSON: number overflow parsing '1e400'
profile job int64-max 2 job-int64-max.json: /parallel/tp: 9223372036854775807 must be at most 1048576
profile job negative-size 2 job-negative-size.json: /parallel/tp: -4096 must be at least 1
profile job nan 2 not valid JSON: syntax error while parsing value - invalid literal
profile job unknown-key 2 job-unknown-key.json: /parallel/tensor_paralel: unknown key
profile job schema-major 5 job-schema-major.json: /schema_version: "2.0.0" has major version 2, this dhelix reads major version 1 only
profile job missing 3 does-not-exist.json: cannot open file for reading
profile job directory 3 directory.json: is a directory, expected a file
profile job empty 2 not valid JSON: syntax error while parsing value - unexpected end of input; expected '[', '{', or a literal
profile job garbage 2 not valid JSON: syntax error while parsing value - invalid literal
profile job deep 2 arrays and objects nest more than 512 deep
profile model truncated 2 not valid JSON: syntax error while parsing
profile model wrong-type 2 model-wrong-type.json: /hidden_size: "4" is string, expected an integer
profile model huge-number 2 model-huge-number.json: not valid JSON: number overflow parsing '1e400'
profile model int64-max 2 model-int64-max.json: /hidden_size: 9223372036854775807 must be at most 1048576
profile model negative-size 2 model-negative-size.json: /hidden_size: -4096 must be at least 1
profile model nan 2 not valid JSON: syntax error while parsing value - invalid literal
profile model unknown-key 2 model-unknown-key.json: /tensor_paralel: unknown key
profile model schema-major 5 model-schema-major.json: /schema_version: "2.0.0" has major version 2, this dhelix reads major version 1 only
profile model missing 3 does-not-exist.json: cannot open file for reading
profile model directory 3 directory.json: is a directory, expected a file
profile model empty 2 not valid JSON: syntax error while parsing value - unexpected end of input; expected '[', '{', or a literal
profile model garbage 2 not valid JSON: syntax error while parsing value - invalid literal
profile model deep 2 arrays and objects nest more than 512 deep
profile cluster truncated 2 not valid JSON: syntax error while parsing
profile cluster wrong-type 2 cluster-wrong-type.json: /gpus_per_node: "4" is string, expected an integer
profile cluster huge-number 2 cluster-huge-number.json: not valid JSON: number overflow parsing '1e400'
profile cluster int64-max 2 cluster-int64-max.json: /gpus_per_node: 9223372036854775807 must be at most 1048576
profile cluster negative-size 2 cluster-negative-size.json: /gpus_per_node: -4096 must be at least 1
profile cluster nan 2 not valid JSON: syntax error while parsing value - invalid literal
profile cluster unknown-key 2 cluster-unknown-key.json: /tensor_paralel: unknown key
profile cluster schema-major 5 cluster-schema-major.json: /schema_version: "2.0.0" has major version 2, this dhelix reads major version 1 only
profile cluster missing 3 does-not-exist.json: cannot open file for reading
profile cluster directory 3 directory.json: is a directory, expected a file
profile cluster empty 2 not valid JSON: syntax error while parsing value - unexpected end of input; expected '[', '{', or a literal
profile cluster garbage 2 not valid JSON: syntax error while parsing value - invalid literal
profile cluster deep 2 arrays and objects nest more than 512 deep
diff plan truncated 2 not valid JSON: syntax error while parsing
diff plan wrong-type 2 plan-wrong-type.json: /num_micro_batches: "4" is string, expected an integer
diff plan huge-number 2 plan-huge-number.json: not valid JSON: number overflow parsing '1e400'
diff plan int64-max 2 plan-int64-max.json: /num_micro_batches: 9223372036854775807 must be at most 1048576
diff plan negative-size 2 plan-negative-size.json: /num_micro_batches: -4096 must be at least 1
diff plan nan 2 not valid JSON: syntax error while parsing value - invalid literal
diff plan unknown-key 2 plan-unknown-key.json: /tensor_paralel: unknown key
diff plan schema-major 5 plan-schema-major.json: /schema_version: "2.0.0" has major version 2, this dhelix reads major version 1 only
diff plan provenance 2 /inputs/model/sha256: 0000000000000000000000000000000000000000000000000000000000000000 does not match the plan's own /job/model
diff plan missing 3 does-not-exist.json: cannot open file for reading
diff plan directory 3 directory.json: is a directory, expected a file
diff plan empty 2 not valid JSON: syntax error while parsing value - unexpected end of input; expected '[', '{', or a literal
diff plan garbage 2 not valid JSON: syntax error while parsing value - invalid literal
diff plan deep 2 arrays and objects nest more than 512 deep
CASES

if [[ $table_mode -eq 0 ]]; then
  echo "$passed passed, $failed failed"
  [[ $failed -eq 0 ]]
fi
