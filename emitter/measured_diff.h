#pragma once
// Predicted against measured: a plan (dhelix-plan) beside the timeline dhelix-run --trace
// measured with it (runtime/train/run_trace.h). dhelix-diff PLAN --measured TRACE.
//
// The measured side of every figure is the median over the traced steps (the first step
// pays page faults and cold caches; a median ignores it without a rule about which step to
// drop), averaged over the ranks of a stage (the TP ranks of a stage run the same
// instructions), summed over stages. The predicted side is the same instructions' plan
// times:
//   * co-executed trace: each op's duration in the plan's expanded timeline
//     (emitter/task_expansion.h), matched by (stage, task, op, layer, micro-batch): the
//     co-run time inside SI blocks, the solo time laid out in forward- or backward-only
//     tasks. The embedding and the head and loss have no op records in the plan but steps
//     of their own: their rows ("embedding", "head and loss") are predicted by those steps
//     (the head_loss tasks' times; a task's time beyond its layers where it runs the
//     embedding, emitter/task_expansion.h), in both schedules; pipeline transfers are
//     listed as measured only ("pipeline transfers (no prediction)").
//   * sequential trace (dhelix-run --sequential): each op's solo time (the profile's, kept
//     in the plan's pairings).
//
// Rows:
//   op kinds   per op kind (gemm, attention, all_gather, ...; the plan's op records), the
//              total time of the kind's ops in one iteration;
//   blocks     per (stage, SI block index), the summed span of that block over the stage's
//              SI tasks (first op start to last op end; co-executed traces only);
//   iteration  co-executed trace: the plan's dhelix iteration time, which ends after the
//              exposed gradient sums and the optimizer step, against the median over steps
//              of the longest rank's "iteration" + "dp_reduction" + "optimizer" slices;
//              sequential trace: the largest stage's sum of the ops' solo times and of its
//              embedding and head-and-loss steps (exact for one pipeline stage; pipeline
//              bubbles not counted) against the median of the longest rank's "iteration"
//              slice (the ops alone).
//   memory     per rank, the plan's stage memory against the trace's otherData.memory
//              (emitter/measured_memory.h): weights, gradients, optimizer states (by
//              parameter count and bytes per parameter) and activations (arena and live
//              peak); a trace without a memory record has no memory section.
// error = (measured - predicted) / predicted, in percent.
//
// --fail-if-off PCT fails when the iteration's |error| exceeds PCT. A rank whose model
// states hold another parameter count than the plan's stage fails whatever the flags.

#include <optional>
#include <string>
#include <vector>

#include "emitter/measured_memory.h"
#include "lib/json_reader.h"
#include "lib/plan/plan.h"

namespace dhelix {

/// One compared figure; predicted_us is absent where the plan has no prediction.
struct MeasuredRow {
  std::string name;
  std::optional<double> predicted_us;
  double measured_us = 0;
  /// (measured - predicted) / predicted x 100; absent without a prediction.
  std::optional<double> error_pct() const;
};

struct MeasuredDiff {
  std::string plan_label;
  std::string trace_label;
  std::string schedule;  ///< "co-executed" or "sequential"
  int64_t steps = 0;
  int64_t ranks = 0;
  std::vector<MeasuredRow> op_kinds;
  std::vector<MeasuredRow> blocks;
  MeasuredRow iteration;
  std::optional<MeasuredMemory> memory;  ///< absent: the trace has no memory record
  std::vector<std::string> failures;     ///< --fail-if-off reasons, parameter mismatches
  /// A trace without a plan identity (lib/plan_identity.h): what could not be checked.
  std::vector<std::string> warnings;
};

/// Compares `plan` with `trace` (a parsed dhelix-run --trace file named `trace_label`).
/// Throws Error(kInvalidInput) naming the trace and the field when it is not a measured
/// trace, was measured for another job or another plan identity (lib/plan_identity.h: the
/// message names both hashes and the first job field that differs), or has ranks or steps
/// missing.
MeasuredDiff compare_measured(const Plan& plan, const Json& trace, const std::string& trace_label,
                              std::optional<double> fail_if_off_pct);

/// A fixed-width table of the three time sections, then the memory section.
std::string measured_diff_text(const MeasuredDiff& diff);

/// {"plan", "trace", "schedule", "steps", "ranks", "iteration", "op_kinds", "blocks",
/// "memory", "failures"}; rows as {"name", "predicted_us", "measured_us", "error_pct"} (null
/// where absent); "memory" as measured_memory_json (null without a record).
OrderedJson measured_diff_json(const MeasuredDiff& diff);

}  // namespace dhelix
