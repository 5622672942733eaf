#!/usr/bin/env bash
# Every program a test or script calls is installed by scripts/install-deps.sh, or comes
# with every Debian system (an Essential or Priority: required package). mpi_profile_cpu
# failed on a fresh Debian because three tests called `bc`, which nothing installed.
#
# The scripts are read, not run: heredoc bodies (Python), comments and quoted text are
# dropped, then each word in command position (line start, after | & ; ( $( ! and the
# keywords then/do/else) that is not a shell builtin, keyword or a function of the script
# is looked up: `command -v` (then /usr/bin, where a pyenv shim hides the system program),
# symbolic links resolved, `dpkg -S` names its package.
#
# Usage: deps_test.sh SOURCE_DIR
set -u
src=$(cd "${1:?usage: deps_test.sh SOURCE_DIR}" && pwd)
if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "skipped: not a Debian system (no dpkg-query)"
  exit 77
fi

# Programs a script only calls when present, behind its own check (GPU tools, the browser
# the SVG render test uses when it finds one), and the binaries the build makes.
# sudo: install-deps.sh itself uses it only when not run as root.
optional=" nvidia-smi nvcc ccache chromium sudo dhelix-plan dhelix-profile dhelix-run dhelix-diff
  dhelix_gpu_tests dhelix_gpu_interference "

# Every package array of the script (core_packages, test_packages): the test suite installs all.
listed=$(sed -n '/^[a-z_]*packages=(/,/^)/p' "$src/scripts/install-deps.sh" | sed 's/#.*//' |
  tr -s ' \t()' '\n' | grep -v -e '^[a-z_]*packages=' -e '^$')

scan=$(cat <<'PY'
import re, sys

def strip_quotes(text):
    """Drops quoted text but keeps the code of $( ) inside double quotes."""
    out, stack, i = [], ["code"], 0
    while i < len(text):
        c, top = text[i], stack[-1]
        if top == "dq":
            if c == "\\":
                i += 2
                continue
            if c == '"':
                stack.pop()
            elif text.startswith("$(", i):
                stack.append(0)
                out.append("$(")
                i += 2
                continue
            i += 1
            continue
        if c == "'":
            end = text.find("'", i + 1)
            i = len(text) if end < 0 else end + 1
            continue
        if c == '"':
            stack.append("dq")
        elif c == "(" and isinstance(top, int):
            stack[-1] += 1
        elif c == ")" and isinstance(top, int):
            if top == 0:
                stack.pop()
            else:
                stack[-1] -= 1
        elif text.startswith("$(", i):
            stack.append(0)
            out.append("$(")
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)
def defined_functions(text):
    return set(re.findall(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(\)", text, re.M))
for path in sys.argv[1:]:
    text = open(path).read()
    functions = defined_functions(text)
    # The functions of a file it sources (". "$SRC/scripts/gpu-lib.sh"): named by its path's
    # tail, found among the files scanned.
    for sourced in re.findall(r"^\s*(?:\.|source)\s+\S*?/([\w.-]+/[\w.-]+\.sh)\b", text, re.M):
        for other in sys.argv[1:]:
            if other.endswith("/" + sourced):
                functions |= defined_functions(open(other).read())
    lines, heredoc = [], None
    for line in text.split("\n"):
        if heredoc:
            if line.strip() == heredoc:
                heredoc = None
            continue
        m = re.search(r"<<-?\s*['\"]?([A-Za-z_]+)['\"]?", line)
        if m:
            heredoc = m.group(1)
        if not line.lstrip().startswith("#"):
            lines.append(re.sub(r"\s#\s.*$", "", line))
    body = strip_quotes("\n".join(lines))
    body = re.sub(r"\b\w+=\([^)]*\)", "", body, flags=re.S)  # arrays: packages=( ... )
    body = re.sub(r"\$?\(\([^()]*(\([^()]*\)[^()]*)*\)\)", "0", body)
    body = re.sub(r"^[ \t]*[A-Za-z0-9_*|./ -]+\)", "", body, flags=re.M)  # case patterns
    start = r"(?:^|[;&|(!{]|\$\(|\bthen\b|\bdo\b|\belse\b|\btime\b)"
    for word in re.findall(start + r"[ \t]*([a-z][a-z0-9_.+-]*)(?=[ \t]|$|\))", body, re.M):
        if word not in functions:
            print(word, path)
PY
)
mapfile -t words < <(find "$src/tests" "$src/scripts" -name '*.sh' -print0 | sort -z |
  xargs -0 python3 -c "$scan")

# A listed package brings its direct dependencies (python3 -> python3-minimal).
for package in $listed; do
  listed+=$'\n'$(dpkg-query -W -f='${Depends}, ${Pre-Depends}' "$package" 2>/dev/null |
    tr ',|' '\n\n' | sed 's/(.*//; s/:any//; s/ //g' | grep -v '^$')
done

builtins=" $(compgen -b | tr '\n' ' ') $(compgen -k | tr '\n' ' ') "
failures=0
checked=" "
for entry in "${words[@]}"; do
  read -r word path <<<"$entry"
  [[ $builtins == *" $word "* || $optional == *" $word "* || $checked == *" $word "* ]] && continue
  checked+="$word "
  program=$(command -v "$word" 2>/dev/null)
  if [[ -z $program || $program != /* ]]; then
    [[ -x /usr/bin/$word ]] && program=/usr/bin/$word
  fi
  if [[ -z $program || $program != /* ]]; then
    echo "FAIL  $word (called by ${path#"$src"/}) is not installed here"
    failures=$((failures + 1))
    continue
  fi
  package=""
  # The path as called first: /usr/bin/python3 belongs to python3-minimal, which python3
  # pulls in, while its target python3.11 belongs to python3.11-minimal, one level deeper.
  # /sbin: on a merged /usr, dpkg knows tc as /sbin/tc while the shell finds /usr/sbin/tc.
  for candidate in "$program" "/usr/bin/$word" "/bin/$word" "/sbin/${program##*/}" \
    "$(readlink -f "$program")"; do
    [[ -z $package ]] && package=$(dpkg -S "$candidate" 2>/dev/null | head -1 | cut -d: -f1)
  done
  if [[ -z $package ]]; then
    if [[ -x /usr/bin/$word ]]; then
      echo "FAIL  $word (called by ${path#"$src"/}) belongs to no Debian package"
      failures=$((failures + 1))
    fi
    continue  # e.g. a pyenv python3 shim, with the packaged /usr/bin one absent: see below
  fi
  base=$(dpkg-query -W -f='${Essential} ${Priority}' "$package" 2>/dev/null)
  if [[ $base == yes* || $base == *required ]] || grep -qx "$package" <<<"$listed"; then
    echo "ok    $word ($package)"
  else
    echo "FAIL  $word (called by ${path#"$src"/}) comes from $package, which" \
      "scripts/install-deps.sh does not install and a fresh Debian lacks"
    failures=$((failures + 1))
  fi
done
if ((failures > 0)); then
  echo "$failures program(s) the tests call may be missing"
  exit 1
fi
echo "every program the tests and scripts call is installed by scripts/install-deps.sh"
