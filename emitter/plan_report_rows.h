#pragma once
// The rows of a plan report (emitter/plan_report.h), computed once from the plan and
// rendered three ways: text and markdown from the same display cells (so a figure reads
// the same in both), JSON from the numbers, rounded in one place. The figures a report
// derives (a scheme's exposed communication summed over types, the SI table of pairing 0,
// what stays hidden) are worked out here and nowhere else; the renderers only lay out.
//
//   ReportRows rows = report_rows(plan);     // numbers, typed
//   scheme_cells(rows.schemes[0])            -> {"dhelix", "238.585 s", "94.8", "63.3%", ...}
//   render_report_text(rows)                 // plan_report.cc
//   render_report_markdown(rows)             // plan_report_markdown.cc
//   render_report_json(rows)                 // plan_report_json.cc

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lib/plan/plan.h"

namespace dhelix::report_detail {

/// bytes per GiB.
inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

/// One scheme of the comparison.
struct SchemeRow {
  PipelineScheme scheme = PipelineScheme::kDHelix;
  PipelineShape shape = PipelineShape::kW;
  int64_t chunks_per_stage = 1;  ///< model chunks a stage holds (interleaved: v)
  double iteration_us = 0;
  double tflops_per_gpu = 0;
  double mfu = 0;
  double bubble_ratio = 0;
  double speedup_vs_megatron = 0;
  bool fits = true;
  double exposed_comm_us = 0;           ///< summed over the communication types
  std::vector<PlanCommTime> comm;       ///< as the plan lists them (tp, cp, ep, dp, pp)
  std::vector<PlanStageMemory> memory;  ///< per stage
};

/// One pairing: which stages use it, the scope chosen and what each scope costs.
struct PairingRow {
  int64_t pairing = 0;
  std::vector<int64_t> stages;
  PairingScope scope = PairingScope::kLayer;
  int64_t chunk_layers = 0;
  int64_t window_layers = 0;
  double layer_scope_us = 0;
  double chunk_scope_us = 0;
  double sequential_us = 0;
  int64_t layer_segment_bound = 0;   ///< PlanPairing's: 0 = as asked
  int64_t window_segment_bound = 0;  ///< likewise
};

/// One communication op of an SI block.
struct SiComm {
  std::string op;  ///< full id
  Pass strand = Pass::kForward;
  std::optional<ParallelDim> group;
  double time_us = 0;
  double exposed_us = 0;  ///< 0 when hidden (below 1e-6 us counts as hidden)
  std::vector<std::string> hidden_under;
};

/// One SI block: its compute ops per strand (start order) and its communication ops.
struct SiBlock {
  double time_us = 0;
  std::vector<std::string> forward_ops;
  std::vector<std::string> backward_ops;
  std::vector<SiComm> comm;
};

/// The SI pairing of one layer: pairing 0's layer-scope blocks.
struct SiTable {
  double layer_pair_us = 0;
  double sequential_us = 0;  ///< one layer's forward alone + its backward alone
  double comm_us = 0;
  double exposed_us = 0;
  std::vector<SiBlock> blocks;
};

/// The best baseline that fits in memory.
struct BestBaselineRow {
  PipelineScheme scheme = PipelineScheme::kMegatron1F1B;
  double iteration_us = 0;
  double dhelix_speedup = 0;          ///< its time over dhelix's
  double dhelix_speedup_vs_1f1b = 0;  ///< dhelix's speedup_vs_megatron
};

/// Everything a report shows, in the order it shows it.
struct ReportRows {
  std::string job;
  int64_t num_micro_batches = 0;
  int64_t stages = 0;
  int64_t gpus = 0;  ///< every rank of every stage
  PlanMemoryBudget budget;
  std::vector<SchemeRow> schemes;  ///< in plan order
  std::vector<PairingRow> pairings;
  /// The dhelix scheme's memory per stage; nullopt when the plan lacks the scheme.
  std::optional<std::vector<PlanStageMemory>> dhelix_memory;
  std::optional<SiTable> si;  ///< nullopt when the plan has no pairing
  /// The fastest scheme other than dhelix that fits in memory (Plan::best_baseline), with
  /// dhelix's speed-up over it (0 without a dhelix time); nullopt when none fits.
  std::optional<BestBaselineRow> best_baseline;
  /// Megatron's virtual pipeline size, and why it is 1 where it is; nullopt without the
  /// megatron-interleaved scheme.
  std::optional<std::string> interleaving;
  /// The generous dualpipev (Plan::upper_bound) and dhelix's speed-up over it, apart from
  /// the baselines; nullopt when the plan lacks it or it does not fit.
  std::optional<BestBaselineRow> upper_bound;
  /// Baselines the plan lacks because the job rules them out, each "name: why".
  std::vector<std::string> absent;
  /// "dhelix plan shape: v (why)"; nullopt for plans before 1.3.0 (always the W).
  std::optional<std::string> shape_sentence;
  std::optional<PlanShapeChoice> shape_choice;
};

/// The rows of `plan`; Error(kInvalidInput) when a block of the first pairing names an op
/// the pairing lacks.
ReportRows report_rows(const Plan& plan);

// ---- display cells shared by text and markdown ----------------------------------------

/// "llama-25b-a40-dp8-tp8: 128 micro-batches, 1 stage, 64 GPUs (A40)".
std::string headline(const ReportRows& rows);
/// The sentence under the scheme table: Megatron's virtual pipeline size, the fastest
/// baseline that fits and dhelix's gain over it and over plain 1F1B.
std::string best_baseline_sentence(const ReportRows& rows);
/// The line under it: the upper bound (the generous dualpipev) and dhelix's gain over it,
/// then why absent baselines are absent, one "name: why" each, joined by "; "; empty when
/// there is nothing to say.
std::string upper_bound_sentence(const ReportRows& rows);
/// scheme, iteration, TFLOPS/GPU, MFU, bubble, exposed comm, speed-up, fits.
std::vector<std::string> scheme_cells(const SchemeRow& row);
/// "12.3 ms / 4.5 ms": hidden / exposed.
std::string comm_cell(const PlanCommTime& comm);
/// "1.25 GiB".
std::string gib_cell(int64_t bytes);
/// stage, total, weights, gradients, optimizer, activations (GiB with 2 decimals).
std::vector<std::string> memory_cells(const PlanStageMemory& memory);
/// "pairing 0 (stages 0,1): scope layer; SI block of ...".
std::string pairing_sentence(const PairingRow& row);
/// "dhelix memory per GPU (73.00 GiB usable on H100-SXM)".
std::string memory_title(const ReportRows& rows);
/// The SI table's title, and its last line (layer pair against strands in turn).
std::string si_title();
std::string si_footer(const SiTable& table);
/// Compute ops without their "fwd."/"bwd." prefix (the column names the strand).
std::vector<std::string> short_ops(const std::vector<std::string>& ids);
/// "allgather_attn (fwd, tp): hidden", one per communication op of the block.
std::vector<std::string> comm_cells(const SiBlock& block);
/// A duration in milliseconds with 3 decimals: "24.314 ms".
std::string block_millis(double us);

// ---- the three forms ----------------------------------------------------------------

std::string render_report_text(const ReportRows& rows);
std::string render_report_markdown(const ReportRows& rows);
std::string render_report_json(const ReportRows& rows);

}  // namespace dhelix::report_detail
