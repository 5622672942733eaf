#!/usr/bin/env python3
"""Docs that run: executes every ```sh block of the given Markdown files exactly as
written, in order, in one shell per document, and checks the output the document shows.

    docs_test.py BUILD_DIR SOURCE_DIR DOC.md...

Each document runs in a scratch folder that looks like a checkout after the build:
examples/, schemas/ and scripts/ link to the source tree, build/ links to BUILD_DIR, and
docs/images/ is empty. So `export PATH="$PWD/build/tools:$PATH"` works as the docs say,
and pictures a command writes under docs/images/ are compared with the checked-in ones
afterwards: the test fails when those are stale (scripts/regenerate-pictures.sh renews
them).

Conventions in the Markdown (they read as ordinary text or are invisible):
- A plain ``` block after a ```sh block (before the next one) is output of the sh block's
  last command. Every line of it must appear in the real output, in order; a line "..."
  stands for any lines, and a line ending in "..." needs only its start to match.
- `<!-- docs-test: skip REASON -->` on the line before a ```sh block: the block is not run
  (the README's scripts/demo.sh and scripts/test.sh, which would build and test
  recursively).
- `<!-- docs-test: output of: COMMAND -->` before a shown-output block: the output is
  checked against COMMAND, run in the same shell state (the demo's planning step).
"""
import os
import re
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!-- docs-test: (skip|output of:)\s*(.*?)\s*-->$")


class Block:
    def __init__(self, kind, text, line, marker):
        self.kind = kind  # "sh" or "output"
        self.text = text
        self.line = line
        self.marker = marker  # (kind, argument) or None
        self.expected = None  # shown output block that follows an sh block


def parse(path):
    """The sh blocks and output blocks of a Markdown file, outputs attached to their sh."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, i, marker = [], 0, None
    while i < len(lines):
        m = MARKER.match(lines[i].strip())
        if m:
            marker = (m.group(1), m.group(2))
            i += 1
            continue
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        lang = fence.group(1)
        if lang == "sh":
            blocks.append(Block("sh", "\n".join(body), start, marker))
        elif lang == "":
            out = Block("output", "\n".join(body), start, marker)
            owner = next((b for b in reversed(blocks) if b.kind == "sh"), None)
            if owner is None or owner.expected is not None:
                sys.exit(f"{path}:{start}: output block without a command block before it")
            owner.expected = out
        marker = None
    return [b for b in blocks if b.kind == "sh"]


def output_problems(expected, actual):
    """Lines of `expected` not found in `actual` in order (see the module comment)."""
    actual_lines = [l.rstrip() for l in actual.split("\n")]
    pos = 0
    for want in (l.rstrip() for l in expected.split("\n")):
        if want.strip() in ("", "..."):
            continue
        prefix = want.endswith("...")
        key = want[:-3] if prefix else want
        while pos < len(actual_lines):
            got = actual_lines[pos]
            pos += 1
            if (got.startswith(key) if prefix else got == want):
                break
        else:
            return f"shown line not in the output (in order): {want!r}"
    return None


def make_scratch(build_dir, source_dir):
    scratch = tempfile.mkdtemp(prefix="dhelix-docs-")
    for name in ("examples", "schemas", "scripts"):
        os.symlink(os.path.join(source_dir, name), os.path.join(scratch, name))
    os.symlink(os.path.abspath(build_dir), os.path.join(scratch, "build"))
    os.makedirs(os.path.join(scratch, "docs", "images"))
    return scratch


def run_document(doc, build_dir, source_dir):
    """Runs one document's blocks; returns a list of failure messages."""
    blocks = parse(doc)
    scratch = make_scratch(build_dir, source_dir)
    # -e as a reader would notice a failing command; no pipefail: `... | head` is fine.
    script = ["set -e"]
    checks = []  # (block, expected, output file)
    for n, block in enumerate(blocks):
        out_file = os.path.join(scratch, f".block{n}.out")
        script.append(f"echo {n} > {scratch}/.current")
        skipped = block.marker is not None and block.marker[0] == "skip"
        if not skipped:
            script.append(f"exec > {out_file} 2>&1")
            script.append(block.text)
        if block.expected is None or (skipped and not block.expected.marker):
            continue
        if block.expected.marker and block.expected.marker[0] == "output of:":
            check_file = os.path.join(scratch, f".block{n}.check.out")
            script.append(f"echo {n}.check > {scratch}/.current")
            script.append(f"exec > {check_file} 2>&1")
            script.append(block.expected.marker[1])
            checks.append((block, block.expected, check_file))
        else:
            checks.append((block, block.expected, out_file))
    script.append(f"echo done > {scratch}/.current")
    env = dict(os.environ)
    env.pop("DHELIX_DETERMINISTIC", None)
    result = subprocess.run(["bash", "-c", "\n".join(script)], cwd=scratch, env=env)
    failures = []
    state = open(os.path.join(scratch, ".current")).read().strip()
    if result.returncode != 0:
        is_check = state.endswith(".check")
        index = state.removesuffix(".check")
        n = int(index) if index.isdigit() else len(blocks) - 1
        out_file = os.path.join(scratch, f".block{n}{'.check' if is_check else ''}.out")
        text = blocks[n].expected.marker[1] if is_check else blocks[n].text
        output = open(out_file).read() if os.path.exists(out_file) else ""
        failures.append(f"{doc}:{blocks[n].line}: block exits {result.returncode}:\n"
                        f"{text}\n--- its output (tail) ---\n{output[-3000:]}")
        return failures, scratch
    for block, expected, out_file in checks:
        output = open(out_file).read()
        problem = output_problems(expected.text, output)
        if problem:
            failures.append(f"{doc}:{expected.line}: {problem}\n--- the command's output ---\n"
                            f"{output[-4000:]}")
    return failures, scratch


def stale_pictures(scratch, source_dir):
    """docs/images files the commands wrote that differ from the checked-in ones."""
    stale = []
    images = os.path.join(scratch, "docs", "images")
    for name in sorted(os.listdir(images)):
        checked_in = os.path.join(source_dir, "docs", "images", name)
        fresh = open(os.path.join(images, name), "rb").read()
        if not os.path.exists(checked_in) or open(checked_in, "rb").read() != fresh:
            stale.append(f"docs/images/{name} is stale: run scripts/regenerate-pictures.sh")
    return stale


def stale_concepts_figure(source_dir):
    """docs/images/concepts.svg against a fresh run of its generator."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = os.path.join(tmp, "concepts.svg")
        subprocess.run([sys.executable, os.path.join(source_dir, "scripts", "concepts-figure.py"),
                        fresh], check=True)
        checked_in = os.path.join(source_dir, "docs", "images", "concepts.svg")
        if open(fresh, "rb").read() != open(checked_in, "rb").read():
            return ["docs/images/concepts.svg is stale: run scripts/regenerate-pictures.sh"]
    return []


def main():
    build_dir, source_dir, docs = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3:]
    failures = stale_concepts_figure(source_dir)
    for doc in docs:
        doc_failures, scratch = run_document(os.path.join(source_dir, doc), build_dir,
                                             source_dir)
        failures += doc_failures
        if not doc_failures:
            failures += stale_pictures(scratch, source_dir)
        print(f"{doc}: {'ok' if not doc_failures else 'FAILED'} (scratch {scratch})")
    for failure in failures:
        print("FAIL:", failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
