#!/usr/bin/env bash
# Writes every output of the tools on the shipped examples into OUT_DIR, one folder per
# job: the plan, its three reports, Chrome trace, SVG pictures, the job summary (text and
# JSON), the layer DAGs (DOT and JSON), the plan check, every tool's exit status and
# standard error, the rank programs of the plan (first rank of each stage, both modes), and
# dhelix-diff between pairs of the plans (text and JSON).
#
# Usage: outputs.sh BUILD_DIR SRC_DIR OUT_DIR
#   BUILD_DIR holds tools/dhelix-plan, tools/dhelix-diff and tests/dhelix_dump_rank_programs.
#
# The tools run in OUT_DIR with relative paths (examples/ is a link to the source's), and
# with DHELIX_DETERMINISTIC=1, so that the outputs depend on nothing but the code and the
# examples. The git hash the tools record is replaced by "GIT": it changes with every
# commit, the outputs must not. A file over 256 KiB (a plan of many stages, a Chrome trace,
# the rank programs of 64 ranks) is kept as its SHA-256 and size (FILE.sha256): still
# compared byte for byte, without checking hundreds of megabytes into git. The golden test (outputs_test.sh) compares OUT_DIR with
# tests/golden/outputs/ byte for byte; tests/golden/regenerate.sh refreshes that folder.
set -euo pipefail

build_dir=$(cd "${1:?usage: outputs.sh BUILD_DIR SRC_DIR OUT_DIR}" && pwd)
src_dir=$(cd "${2:?}" && pwd)
out_dir=${3:?}
mkdir -p "$out_dir"
out_dir=$(cd "$out_dir" && pwd)
cd "$out_dir"
ln -sfn "$src_dir/examples" examples
export DHELIX_DETERMINISTIC=1
plan="$build_dir/tools/dhelix-plan"
diff_tool="$build_dir/tools/dhelix-diff"
dump_tool="$build_dir/tests/dhelix_dump_rank_programs"

# Runs a tool, its standard output to $1, its standard error and exit status to $1.status.
run() {
  local out=$1
  shift
  local status=0
  "$@" >"$out" 2>"$out.stderr" || status=$?
  echo "exit $status" >>"$out.stderr"
  mv "$out.stderr" "$out.status"
}

mask_git_hash() {
  sed -i -E -e 's/"git_hash": "[^"]*"/"git_hash": "GIT"/g' -e 's/\(git [0-9a-f]+(-dirty)?\)/(git GIT)/g' "$@"
}

# Every shipped job. The plan check runs on the jobs that check in seconds.
read -r -a jobs <<<"$(cd "$src_dir/examples/jobs" && ls -- *.json | sed 's/\.json$//' | tr '\n' ' ')"
for job in "${jobs[@]}"; do
  mkdir -p "$job"
  j="examples/jobs/$job.json"
  run "$job/report.txt" "$plan" "$j" -o "$job/plan.json" --trace "$job/trace.json" --svg "$job/picture"
  # The plan's hash is in dhelix-diff's output: mask the git hash before anything reads it.
  [[ -f $job/plan.json ]] && mask_git_hash "$job/plan.json"
  # The markdown and JSON reports plan again: left out for the two jobs slowest to plan.
  case $job in
    llama-66b-a800-dp1-tp8-cp4-pp2-seq32k | phi-42b-a800-dp16-ep8-pp4) ;;
    *)
      run "$job/report.md" "$plan" "$j" --report markdown
      run "$job/report.json" "$plan" "$j" --report json
      ;;
  esac
  run "$job/summary.txt" "$plan" "$j" --validate-only
  run "$job/summary.json" "$plan" "$j" --validate-only --json
  run "$job/dag.dot" "$plan" dag "$j"
  run "$job/dag.json" "$plan" dag "$j" --format json
  case $job in
    tiny-* | llama-8b-a40-dp16-tp4 | gpt-6.7b-a40-dp16-tp4 | llama-39b-a40-dp4-tp8-pp2)
      run "$job/check.txt" "$plan" --check "$job/plan.json"
      run "$job/rank-programs.txt" "$dump_tool" "$job/plan.json"
      ;;
  esac
done

# dhelix-diff between plans of related jobs.
diff_pair() {
  local name=$1 a=$2 b=$3
  mkdir -p diffs
  run "diffs/$name.txt" "$diff_tool" "$a/plan.json" "$b/plan.json"
  run "diffs/$name.json" "$diff_tool" --json "$a/plan.json" "$b/plan.json"
}
diff_pair tiny-tp2-vs-dp2-tp2 tiny-tp2 tiny-dp2-tp2
diff_pair tiny-tp2-vs-tp2-pp2 tiny-tp2 tiny-tp2-pp2
diff_pair llama-25b-a40-vs-h100 llama-25b-a40-dp8-tp8 llama-25b-h100-dp2-tp16
diff_pair llama-8b-dp16-vs-cp2 llama-8b-a40-dp16-tp4 llama-8b-a40-dp8-tp4-cp2-seq16k
diff_pair gpt-30b-pp2-vs-cp2 gpt-30b-a40-dp4-tp8-pp2 gpt-30b-a40-dp2-tp8-cp2-pp2-seq16k
diff_pair llama-39b-pp2-vs-cp2 llama-39b-a40-dp4-tp8-pp2 llama-39b-a40-dp2-tp8-cp2-pp2-seq16k

# The git hash in `meta` and in version lines changes with every commit.
rm examples
find . -type f -print0 | xargs -0 sed -i -E \
  -e 's/"git_hash": "[^"]*"/"git_hash": "GIT"/g' -e 's/\(git [0-9a-f]+(-dirty)?\)/(git GIT)/g'

# Large outputs: their digest only.
find . -type f -size +256k -print0 | while IFS= read -r -d '' file; do
  echo "sha256 $(sha256sum "$file" | cut -d' ' -f1) bytes $(stat -c %s "$file")" >"$file.sha256"
  rm "$file"
done
