#!/usr/bin/env python3
"""Tables of a dhelix profile's operator times, for the GPU scripts and for people.

  profile-table.py --families PROFILE       time per kernel family, GEMM and attention TFLOP/s
  profile-table.py MEASURED PREDICTED       each op both profiles time: measured, predicted, error

The second form is how scripts/gpu-first-light.sh sets a `dhelix-profile --backend cuda`
measurement beside `dhelix-profile --backend model` for the same job: ops are joined by
signature (lib/op_catalogue.cc), so both profiles must be of the same job shape. The error
is (predicted - measured) / measured: positive means the model is pessimistic, negative
that it promises more speed than the GPU gave.

FLOPs: a GEMM signature's m, n, k (times b for grouped GEMMs) give 2 m n k; attention
gives 4 b h q kv d, halved under the causal mask, times 2.5 for the backward (docs/cost-model.md).
"""
import argparse
import json
import re
import sys


def fields(signature):
    return {k: int(v) for k, v in re.findall(r"([a-z]+)=(\d+)", signature)}


def family(signature):
    kind = signature.split(":", 1)[0]
    return kind


def flops(signature):
    kind, f = family(signature), fields(signature)
    if kind in ("gemm", "head", "router") and {"m", "n", "k"} <= f.keys():
        return 2.0 * f["m"] * f["n"] * f["k"]
    if kind == "grouped_gemm" and {"b", "m", "n", "k"} <= f.keys():
        return 2.0 * f["b"] * f["m"] * f["n"] * f["k"]
    if kind.startswith("attention.") and {"b", "h", "q", "kv", "d"} <= f.keys():
        value = 4.0 * f["b"] * f["h"] * f["q"] * f["kv"] * f["d"]
        value *= 0.5 if ",causal" in signature else 1.0
        return value * (2.5 if kind == "attention.bwd" else 1.0)
    return 0.0


def load(path):
    try:
        with open(path, encoding="utf-8") as handle:
            profile = json.load(handle)
        return {op["signature"]: float(op["time_us"]["median"]) for op in profile["ops"]}
    except (OSError, ValueError, KeyError, TypeError) as error:
        sys.exit(f"profile-table: {path}: not a dhelix profile ({error})")


def tflops(signature, time_us):
    work = flops(signature)
    return f"{work / time_us / 1e6:.1f}" if work and time_us > 0 else ""


def families_table(path):
    times = load(path)
    by_family = {}
    for signature, time_us in times.items():
        entry = by_family.setdefault(family(signature), [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += time_us
        entry[2] += flops(signature)
    print(f"{'family':<22} {'ops':>4} {'sum of medians (us)':>20} {'TFLOP/s':>8}")
    for name, (count, total, work) in sorted(by_family.items(), key=lambda item: -item[1][1]):
        rate = f"{work / total / 1e6:.1f}" if work and total > 0 else ""
        print(f"{name:<22} {count:>4} {total:>20.1f} {rate:>8}")


def comparison_table(measured_path, predicted_path):
    measured, predicted = load(measured_path), load(predicted_path)
    common = [s for s in measured if s in predicted]
    if not common:
        sys.exit("profile-table: the two profiles share no op signature (not the same job shape?)")
    print("| op signature | measured (us) | TFLOP/s | model (us) | TFLOP/s | error |")
    print("|---|---:|---:|---:|---:|---:|")
    errors = []
    for signature in sorted(common, key=lambda s: -measured[s]):
        m, p = measured[signature], predicted[signature]
        error = (p - m) / m if m > 0 else float("nan")
        errors.append(abs(error))
        print(f"| `{signature}` | {m:.1f} | {tflops(signature, m)} | {p:.1f} | "
              f"{tflops(signature, p)} | {100 * error:+.1f} % |")
    only = len(measured) - len(common)
    print(f"\n{len(common)} ops compared, mean absolute error {100 * sum(errors) / len(errors):.1f} %"
          + (f"; {only} measured ops have no model time" if only else ""))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", action="store_true", help="time per kernel family")
    parser.add_argument("profiles", nargs="+", help="PROFILE, or MEASURED PREDICTED")
    args = parser.parse_args()
    if args.families and len(args.profiles) == 1:
        families_table(args.profiles[0])
    elif not args.families and len(args.profiles) == 2:
        comparison_table(*args.profiles)
    else:
        parser.error("give --families PROFILE, or MEASURED PREDICTED")


if __name__ == "__main__":
    main()
