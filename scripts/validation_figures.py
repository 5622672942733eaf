"""Tables of docs/validation.md from a folder of plans (one per example job, named after it).

Called by scripts/validation-table.sh. The paper's figures are listed once, below, each with
where it is stated; a prediction is read from the plans by the rule in its row.
"""
import glob
import json
import os
import sys

ORDER = ["megatron-1f1b", "intra-batch", "wavelet+", "dhelix"]


def load(folder):
    plans = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        plan = json.load(open(path))
        plans[os.path.basename(path)[:-5]] = {s["scheme"]: s for s in plan["schemes"]} | {
            "_plan": plan}
    return plans


def job_rows(plans):
    out = ["| job | Megatron | intra-batch | Wavelet+ | DHelix | speed-ups (intra / Wavelet+ / DHelix) "
           "| DHelix tokens/s | scope | DHelix bubble | fits |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in plans.items():
        tflops = " | ".join(f"{s[k]['tflops_per_gpu']:.1f}" for k in ORDER)
        speedups = " / ".join(f"{s[k]['speedup_vs_megatron']:.2f}" for k in ORDER[1:])
        d = s["dhelix"]
        out.append(f"| `{name}` | {tflops} | {speedups} | {d['tokens_per_second']:.0f} | "
                   f"{s['_plan']['pairings'][0]['scope']} | {100 * d['bubble_ratio']:.1f} % | "
                   f"{'yes' if d['fits'] else 'no'} |")
    return out


# The schemes people run as they are priced (lib/plan/plan_kinds.h, run_as_priced): DHelix's
# gain is stated over the fastest of them that fits. The generous dualpipev (its overlapped
# pairs from DHelix's own search) is shown apart, as the upper bound.
BASELINES = ["megatron-1f1b", "megatron-interleaved", "zb-h1", "zb-v", "dualpipev-handwritten",
             "megatron-a2a-overlap"]
UPPER_BOUND = "dualpipev"


def baseline_cell(scheme):
    """TFLOPS/GPU and bubble of one baseline, "-" when the plan lacks it, "(OOM)" when it
    does not fit."""
    if scheme is None:
        return "-"
    oom = "" if scheme["fits"] else " (OOM)"
    return f"{scheme['tflops_per_gpu']:.1f} / {100 * scheme['bubble_ratio']:.1f} %{oom}"


def gain_cell(scheme, dhelix):
    """DHelix's speed-up over `scheme` (its time over DHelix's), "-" without it."""
    return f"{scheme['iteration_us'] / dhelix['iteration_us']:.2f}x" if scheme else "-"


def baseline_rows(plans):
    """The pipelines people run beside DHelix: the fastest that fits and DHelix's gain over
    it, and the generous DualPipeV as the upper bound (docs/pipeline.md, "The baselines
    people run")."""
    out = ["| job | pp x m | 1F1B | interleaved (v) | ZB-H1 | ZB-V | DualPipeV hand-written | "
           "Megatron a2a overlap | best baseline that fits | DHelix over it | DualPipeV, search "
           "pairs (upper bound) | DHelix over the upper bound | DHelix over 1F1B |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in plans.items():
        plan = s["_plan"]
        pp = len(plan["stages"])
        cells = []
        for k in BASELINES:
            cell = baseline_cell(s.get(k))
            if k in ("megatron-interleaved", "megatron-a2a-overlap") and k in s:
                cell += f" (v {s[k].get('chunks_per_stage', 1)})"
            cells.append(cell)
        fitting = [s[k] for k in BASELINES if k in s and s[k]["fits"]]
        best = min(fitting, key=lambda x: x["iteration_us"]) if fitting else None
        d = s["dhelix"]
        bound = s.get(UPPER_BOUND)
        bound = bound if bound and bound["fits"] else None
        out.append(f"| `{name}` | {pp} x {plan['num_micro_batches']} | " + " | ".join(cells) +
                   f" | {best['scheme'] if best else 'none'} | {gain_cell(best, d)} | "
                   f"{baseline_cell(bound)} | {gain_cell(bound, d)} | "
                   f"{d['speedup_vs_megatron']:.2f}x |")
    return out


def speedup(job, scheme):
    return lambda p: p[job][scheme]["speedup_vs_megatron"]


def tflops(job, scheme):
    return lambda p: p[job][scheme]["tflops_per_gpu"]


def tokens(job, scheme):
    return lambda p: p[job][scheme]["tokens_per_second"]


def comm_share(job, scheme, dim):
    """Exposed communication time of `dim` over the iteration, percent: what the paper's
    breakdown attributes to it (the time that overlapping it can win back)."""
    def f(p):
        s = p[job][scheme]
        return 100 * s["comm"][dim]["exposed_us"] / s["iteration_us"]
    return f


def hidden_share(job, scheme, dim):
    """Hidden part of `dim`'s communication, percent."""
    def f(p):
        c = p[job][scheme]["comm"][dim]
        total = c["hidden_us"] + c["exposed_us"]
        return 100 * c["hidden_us"] / total if total else 0.0
    return f


def best_mfu(jobs, scheme):
    """The highest MFU of `scheme` over `jobs`, percent."""
    return lambda p: max(100 * p[j][scheme]["mfu"] for j in jobs)


def mean_hidden_share(jobs, scheme, dim):
    return lambda p: sum(hidden_share(j, scheme, dim)(p) for j in jobs) / len(jobs)


L8, L25, L39, G18 = ("llama-8b-a40-dp16-tp4", "llama-25b-a40-dp8-tp8", "llama-39b-a40-dp4-tp8-pp2",
                     "gpt-18b-a40-dp8-tp8")
CP2, CP4 = "llama-39b-a40-dp2-tp8-cp2-pp2-seq16k", "llama-39b-a40-dp1-tp8-cp4-pp2-seq32k"
A2, A4 = "llama-66b-a800-dp2-tp8-cp2-pp2-seq16k", "llama-66b-a800-dp1-tp8-cp4-pp2-seq32k"
PHI31, PHI42 = "phi-31b-a40-dp16-ep8-pp4", "phi-42b-a800-dp16-ep8-pp4"
H8, H16, H32 = "llama-25b-h100-dp4-tp8", "llama-25b-h100-dp2-tp16", "llama-25b-h100-dp1-tp32"
TP8_A40 = [L25, G18]
A40_PAPER = [L8, L25, L39, G18, CP2, "llama-8b-a40-dp8-tp4-cp2-seq16k", "gpt-30b-a40-dp2-tp8-cp2-pp2-seq16k"]
A800_PAPER = [A2, A4, PHI42]

# (figure, where the paper states it, measured value, unit, prediction)
FIGURES = [
    ("Llama-8B (16,4,1) intra-batch speed-up", "Fig. 11 / prior-art", 1.06, "x", speedup(L8, "intra-batch")),
    ("Llama-8B (16,4,1) Wavelet+ speed-up", "Fig. 11 / prior-art", 1.06, "x", speedup(L8, "wavelet+")),
    ("Llama-8B (16,4,1) DHelix speed-up", "Fig. 11 / prior-art", 1.31, "x", speedup(L8, "dhelix")),
    ("Llama-25B (8,8,1) intra-batch speed-up", "Fig. 11 / prior-art", 1.09, "x", speedup(L25, "intra-batch")),
    ("Llama-25B (8,8,1) Wavelet+ speed-up", "Fig. 11 / prior-art", 1.16, "x", speedup(L25, "wavelet+")),
    ("Llama-25B (8,8,1) DHelix speed-up", "Fig. 11 / prior-art", 1.40, "x", speedup(L25, "dhelix")),
    ("Llama-39B (4,8,2) intra-batch speed-up", "Fig. 11 / prior-art", 1.10, "x", speedup(L39, "intra-batch")),
    ("Llama-39B (4,8,2) Wavelet+ speed-up", "Fig. 11 / prior-art", 1.02, "x", speedup(L39, "wavelet+")),
    ("Llama-39B (4,8,2) DHelix speed-up", "Fig. 11 / prior-art", 1.27, "x", speedup(L39, "dhelix")),
    ("GPT-18B (8,8,1) intra-batch speed-up", "Fig. 11 / prior-art", 1.05, "x", speedup(G18, "intra-batch")),
    ("GPT-18B (8,8,1) Wavelet+ speed-up", "Fig. 11 / prior-art", 1.12, "x", speedup(G18, "wavelet+")),
    ("GPT-18B (8,8,1) DHelix speed-up", "Fig. 11 / prior-art", 1.40, "x", speedup(G18, "dhelix")),
    ("TP communication hidden by intra-batch (A40, TP 8)", "6.2.1", 26.1, "%", mean_hidden_share(TP8_A40, "intra-batch", "tp")),
    ("TP communication hidden by Wavelet+ (A40, TP 8)", "6.2.1", 39.9, "%", mean_hidden_share(TP8_A40, "wavelet+", "tp")),
    ("TP communication hidden by DHelix (A40, TP 8)", "6.2.1", 83.0, "%", mean_hidden_share(TP8_A40, "dhelix", "tp")),
    ("Phi-31B A40 Megatron tokens/s", "Table 6", 59941, "tok/s", tokens(PHI31, "megatron-1f1b")),
    ("Phi-31B A40 Wavelet+ tokens/s", "Table 6", 62454, "tok/s", tokens(PHI31, "wavelet+")),
    ("Phi-31B A40 DHelix tokens/s", "Table 6", 75386, "tok/s", tokens(PHI31, "dhelix")),
    ("DHelix best MFU on 64 A40 (paper settings)", "abstract", 58.0, "%", best_mfu(A40_PAPER, "dhelix")),
    ("DHelix best MFU on 64 A800 (paper settings)", "abstract", 71.0, "%", best_mfu(A800_PAPER, "dhelix")),
    ("Llama-66B A800 CP 2 Megatron TFLOPS/GPU", "6.3.1", 186.0, "TFLOPS", tflops(A2, "megatron-1f1b")),
    ("Llama-66B A800 CP 4 Megatron TFLOPS/GPU", "6.3.1", 160.9, "TFLOPS", tflops(A4, "megatron-1f1b")),
    ("Llama-66B A800 CP 4 DHelix TFLOPS/GPU", "6.3.1", 199.7, "TFLOPS", tflops(A4, "dhelix")),
    ("Llama-66B A800 CP 2 DHelix speed-up", "prior-art", 1.07, "x", speedup(A2, "dhelix")),
    ("Llama-66B A800 CP 4 DHelix speed-up", "prior-art", 1.24, "x", speedup(A4, "dhelix")),
    ("Llama-66B A800 CP 2 TP share of Megatron's iteration", "6.3.1", 10.0, "%", comm_share(A2, "megatron-1f1b", "tp")),
    ("Llama-39B A40 CP 2 TP share of Megatron's iteration", "6.3.1", 29.0, "%", comm_share(CP2, "megatron-1f1b", "tp")),
    ("Phi-42B A800 DHelix speed-up", "6.3.2 / prior-art", 1.15, "x", speedup(PHI42, "dhelix")),
    ("Phi-42B A800 Wavelet+ speed-up", "6.3.2", 1.04, "x", speedup(PHI42, "wavelet+")),
    ("Llama-39B A40 CP 2 16k: CP share of Megatron's iteration", "6.4", 28.0, "%", comm_share(CP2, "megatron-1f1b", "cp")),
    ("Llama-39B A40 CP 4 32k: CP share of Megatron's iteration", "6.4", 53.0, "%", comm_share(CP4, "megatron-1f1b", "cp")),
    ("Phi-31B A40: EP communication share of Megatron's iteration", "3 (Fig. 3)", 34.3, "%", comm_share(PHI31, "megatron-1f1b", "ep")),
    ("H100 TP 8: TP communication hidden by DHelix", "Table 7", 57.87, "%", hidden_share(H8, "dhelix", "tp")),
    ("H100 TP 16: TP communication hidden by DHelix", "Table 7", 66.73, "%", hidden_share(H16, "dhelix", "tp")),
    ("H100 TP 32: TP communication hidden by DHelix", "Table 7", 51.72, "%", hidden_share(H32, "dhelix", "tp")),
]


def figure_rows(plans):
    out = ["| # | figure | source | paper | predicted | error |", "|---|---|---|---|---|---|"]
    errors = []
    for i, (what, where, paper, unit, predict) in enumerate(FIGURES, 1):
        value = predict(plans)
        if unit == "%":
            error = value - paper  # points
            text = f"{error:+.1f} pt"
            errors.append(abs(error) / paper * 100)
        else:
            error = (value - paper) / paper * 100
            text = f"{error:+.1f} %"
            errors.append(abs(error))
        fmt = (lambda v: f"{v:.2f}") if unit == "x" else (lambda v: f"{v:.0f}") if unit == "tok/s" \
            else (lambda v: f"{v:.1f}")
        out.append(f"| {i} | {what} | {where} | {fmt(paper)} {unit} | {fmt(value)} {unit} | {text} |")
    within = sum(1 for e in errors if e <= 10)
    out.append("")
    out.append(f"Mean absolute error (relative, %): {sum(errors) / len(errors):.1f} % over "
               f"{len(errors)} figures; {within} within 10 %.")
    return out


def main():
    plans = load(sys.argv[1])
    print("\n".join(job_rows(plans)))
    print()
    print("TFLOPS/GPU and bubble of the pipelines people run, under the same costs:")
    print()
    print("\n".join(baseline_rows(plans)))
    print()
    print("\n".join(figure_rows(plans)))


main()
