#pragma once
// The report dhelix-plan prints after planning, as text (the default), markdown or JSON:
// the schemes side by side, where communication stays hidden or exposed, peak memory per
// stage, the pairing scope chosen, and the SI pairing of one layer block by block.
//
//   llama-25b-a40-dp8-tp8: 128 micro-batches, 1 stage, 64 GPUs (A40)
//   scheme            iteration  TFLOPS/GPU     MFU  bubble  exposed comm  speed-up  fits
//   dhelix                 238.585 s        94.8   63.3%    0.0%     18343.0 ms     1.36x   yes
//   ...
//   best baseline that fits: zb-h1 (...); dhelix 1.30x over it, 1.36x over megatron-1f1b
//   upper bound: dualpipev with the search's pairs (...), dhelix 0.98x of it
//   SI pairing of one layer (pairing 0, layer scope): ...
//   block  forward compute  backward compute  communication                      time
//   0      ln_attn          bda_mlp           allgather_attn (fwd, tp): hidden   24.314 ms
//          gemm_qkv         fc2_dgrad         allgather_mlp (bwd, tp): hidden
//   ...
//   layer pair 63.469 ms vs strands one after the other 80.112 ms (1.26x); ...
//
// The SI table shows only the first pairing's layer scope, so that the report stays a few
// dozen lines however large the plan is. Compute-op names drop the "fwd."/"bwd." prefix
// (the column says the strand); the JSON form keeps full op ids.

#include <optional>
#include <string>

#include "lib/plan/plan.h"

namespace dhelix {

/// Version of the JSON report's shape (render_plan_report with ReportFormat::kJson).
/// 1.1.0: best_baseline and each scheme's chunks_per_stage. 1.2.0: best_baseline among the
/// schemes people run (run_as_priced), upper_bound (the generous dualpipev) and
/// absent_baselines ("name: why"); each scheme's shape, and the dhelix plan's "shape"
/// (chosen, requested, reason).
inline constexpr const char* kPlanReportSchemaVersion = "1.2.0";

/// The forms a plan report can take.
enum class ReportFormat { kText, kMarkdown, kJson };

/// "text", "markdown", "json".
const char* report_format_name(ReportFormat format);

/// The format named `name` (exactly one of report_format_name's names), or nullopt.
std::optional<ReportFormat> parse_report_format(const std::string& name);

/// The report of `plan` in `format`; every line ends in a newline. The JSON form is
/// OrderedJson::dump(2), keys in a fixed order, times rounded to 3 decimals (us) and ratios
/// to 6, so the same plan gives the same bytes. Throws Error(kInvalidInput) when a block of
/// the first pairing names an op the pairing lacks.
std::string render_plan_report(const Plan& plan, ReportFormat format);

/// The text report: render_plan_report(plan, ReportFormat::kText).
std::string plan_report_text(const Plan& plan);

}  // namespace dhelix
