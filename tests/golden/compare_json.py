#!/usr/bin/env python3
"""Compares two JSON files by meaning, for golden tests.

Usage: compare_json.py EXPECTED ACTUAL [--ignore KEY]... [--rtol R]

Objects must have the same keys (order does not matter), arrays the same length and
elements in order, strings and booleans must be equal, and numbers equal within a relative
tolerance (default 1e-6; numbers both smaller than 1e-9 in magnitude are equal). Top-level
keys named with --ignore (default: meta) are skipped. Every difference is printed with
its JSON pointer; the exit status is 1 when there is any.
"""
import argparse
import json
import sys


def differences(expected, actual, pointer, rtol, out):
    if isinstance(expected, bool) or isinstance(actual, bool):
        if expected is not actual:
            out.append(f"{pointer or '/'}: expected {json.dumps(expected)}, got {json.dumps(actual)}")
        return
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        scale = max(abs(expected), abs(actual))
        if abs(expected - actual) > rtol * scale and scale >= 1e-9:
            out.append(f"{pointer or '/'}: expected {expected}, got {actual}")
        return
    if type(expected) is not type(actual):
        out.append(f"{pointer or '/'}: expected {json.dumps(expected)[:80]}, "
                   f"got {json.dumps(actual)[:80]}")
        return
    if isinstance(expected, dict):
        for key in sorted(set(expected) | set(actual)):
            child = f"{pointer}/{key}"
            if key not in actual:
                out.append(f"{child}: missing")
            elif key not in expected:
                out.append(f"{child}: unexpected")
            else:
                differences(expected[key], actual[key], child, rtol, out)
        return
    if isinstance(expected, list):
        if len(expected) != len(actual):
            out.append(f"{pointer or '/'}: expected {len(expected)} elements, got {len(actual)}")
        for i, (e, a) in enumerate(zip(expected, actual)):
            differences(e, a, f"{pointer}/{i}", rtol, out)
        return
    if expected != actual:
        out.append(f"{pointer or '/'}: expected {json.dumps(expected)}, got {json.dumps(actual)}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("expected")
    parser.add_argument("actual")
    parser.add_argument("--ignore", action="append", default=None)
    parser.add_argument("--rtol", type=float, default=1e-6)
    args = parser.parse_args()
    ignore = set(args.ignore if args.ignore is not None else ["meta"])
    with open(args.expected) as f:
        expected = json.load(f)
    with open(args.actual) as f:
        actual = json.load(f)
    for document in (expected, actual):
        if isinstance(document, dict):
            for key in ignore:
                document.pop(key, None)
    out = []
    differences(expected, actual, "", args.rtol, out)
    for line in out[:50]:
        print(line)
    if len(out) > 50:
        print(f"... and {len(out) - 50} more")
    print(f"{args.actual}: {'differs from' if out else 'matches'} {args.expected}")
    return 1 if out else 0


if __name__ == "__main__":
    sys.exit(main())
