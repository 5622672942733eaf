#pragma once
// Comparing two plans (lib/plan/plan.h) for people and for CI: what differs in the inputs the
// plans were made for (provenance), in the layer pairings (SI blocks added, removed,
// changed), and in the predicted figures of every scheme, with a few summary sentences.
//
// Numbers are compared with a relative tolerance, so that rounding noise (a time written
// with 3 decimals, recomputed on another machine) is not a change:
//
//   changed(a, b)  <=>  |b - a| > relative_tolerance * max(|a|, |b|)
//
// Blocks of a pairing are matched by their op content, not by position: a block of B with
// the same forward and backward ops as a block of A is the same block (retimed when only
// its time differs); of the blocks left over, a block of A is paired with the block of B
// sharing the most ops (changed); what is left after that was removed (A) or added (B).
//
// Example (tests/golden/llama-8b-a40-vs-h100.diff.json): Llama 8B on dp16 x tp4 planned
// for the A40 and the H100 cluster differs in cluster.name "a40" -> "h100" (and its hash,
// the GPU's memory budget), in 53 of 56 blocks (faster communication relative to compute
// moves ops between blocks), and is summarised as "dhelix is 85.2 % faster on B:
// iteration 83.907 s -> 12.392 s."

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lib/json_reader.h"
#include "lib/plan/plan.h"

namespace dhelix {

/// Version of the diff JSON (emitter/plan_diff_json.cc) this dhelix writes.
inline constexpr const char* kPlanDiffSchemaVersion = "1.0.0";

/// How to compare and which CI conditions to check.
struct DiffOptions {
  /// Numbers within this relative distance are equal (see the file comment); >= 0.
  double relative_tolerance = 1e-6;
  /// --fail-if-slower PCT: a failure when dhelix's iteration time grew by more than PCT %.
  std::optional<double> fail_if_slower_pct;
  /// --fail-if-changed: a failure on any change in the pairing or the predicted figures.
  bool fail_if_changed = false;
};

/// One non-numeric field (or a numeric input such as parallel.tp) that differs; values are
/// JSON text ("\"a40\"", "4"), "" when the field is absent from that plan.
struct FieldChange {
  std::string field;  ///< dotted path, e.g. "cluster.name", "parallel.tp"
  std::string a;
  std::string b;
};

/// One number of both plans.
struct NumberChange {
  std::string field;  ///< e.g. "iteration_us", "comm.tp.exposed_us", "memory.0.total_bytes"
  double a = 0;
  double b = 0;
  bool changed = false;  ///< outside the relative tolerance
  bool integer = false;  ///< a count or a size: written as an integer

  /// b - a.
  double delta() const { return b - a; }
  /// (b - a) / |a|; nullopt when a is 0 (no meaningful ratio).
  std::optional<double> relative() const;
};

/// What happened to one SI block between A and B.
enum class BlockStatus {
  kSame,     ///< same ops, same time
  kRetimed,  ///< same ops, another time
  kChanged,  ///< some ops moved in or out
  kAdded,    ///< only in B
  kRemoved,  ///< only in A
};

/// "same", "retimed", "changed", "added", "removed".
const char* block_status_name(BlockStatus status);

/// One block of A matched with one of B (or with none).
struct BlockDiff {
  std::string list;      ///< "layer", "window" or "remainder": which block list of the pairing
  int64_t index_a = -1;  ///< index in A's list; -1 when added
  int64_t index_b = -1;  ///< index in B's list; -1 when removed
  BlockStatus status = BlockStatus::kSame;
  double time_a_us = 0;                  ///< 0 when added
  double time_b_us = 0;                  ///< 0 when removed
  std::vector<std::string> ops_added;    ///< changed/added: ops of B's block not in A's
  std::vector<std::string> ops_removed;  ///< changed/removed: ops of A's block not in B's
};

/// One stage's pairing template in A against the same stage's in B. Stages whose pairings
/// are the same pair of templates are reported once, with every stage listed.
struct PairingDiff {
  std::vector<int64_t> stages;      ///< ascending
  int64_t pairing_a = 0;            ///< index into A's pairings
  int64_t pairing_b = 0;            ///< index into B's pairings
  std::vector<FieldChange> fields;  ///< scope, chunk_layers, window_layers that differ
  std::vector<NumberChange> times;  ///< layer_scope_us, chunk_scope_us, sequential_us, ...
  std::vector<BlockDiff> blocks;    ///< every block of both, in list then A order
  int64_t ops_retimed = 0;          ///< layer ops whose solo time differs

  /// Blocks other than kSame and kRetimed.
  int64_t structural_changes() const;
};

/// The pairing section: stage counts, per-stage layer ranges, and the templates.
struct PairingSection {
  int64_t stages_a = 0;
  int64_t stages_b = 0;
  std::vector<FieldChange> stage_fields;  ///< "stage.1.down_layers", "stage.0.tasks", ...
  std::vector<PairingDiff> pairings;      ///< by first stage
};

/// The predicted figures of one scheme in A and B.
struct SchemeDiff {
  PipelineScheme scheme = PipelineScheme::kDHelix;
  bool in_a = true;
  bool in_b = true;
  std::vector<FieldChange> fields;    ///< shape, fits that differ
  std::vector<NumberChange> figures;  ///< every number, changed or not
};

/// Everything diff_plans found.
struct PlanDiff {
  /// What the text header calls the plans (file names in dhelix-diff); the summary and the
  /// JSON always say A and B, so that they do not depend on where the files lie.
  std::string label_a = "A";
  std::string label_b = "B";
  double relative_tolerance = 1e-6;
  std::vector<FieldChange> inputs;  ///< provenance fields that differ
  PairingSection pairing;
  std::vector<SchemeDiff> schemes;    ///< in the order a plan lists them
  std::vector<std::string> summary;   ///< a few human sentences
  std::vector<std::string> failures;  ///< the CI conditions met, one reason each

  /// Whether anything other than provenance differs (what --fail-if-changed checks).
  bool plan_changed() const;
  /// Whether nothing at all differs.
  bool identical() const { return inputs.empty() && !plan_changed(); }
};

/// Compares plan `a` with plan `b`; `options.relative_tolerance` must be >= 0. Labels are
/// "A" and "B"; callers may set them before rendering text.
PlanDiff diff_plans(const Plan& a, const Plan& b, const DiffOptions& options);

/// Whether two numbers differ by more than `relative_tolerance` (see the file comment).
bool numbers_differ(double a, double b, double relative_tolerance);

/// The diff as text for a terminal: summary, then only what differs, section by section.
std::string plan_diff_to_text(const PlanDiff& diff);

/// The diff as JSON (keys in a fixed order, numbers rounded): schema_version, meta,
/// tolerance, identical, plan_changed, summary, inputs, pairing, schemes, failures.
/// `meta` is provenance_to_json of the run (an empty object is fine).
OrderedJson plan_diff_to_json(const PlanDiff& diff, const OrderedJson& meta);

/// A duration for sentences: "850.0 us", "4.1 ms", "98.375 s".
std::string format_duration_us(double time_us);

}  // namespace dhelix
