#pragma once
// Predicted against measured memory: dhelix-diff PLAN --measured TRACE, per rank, the plan's
// memory of the rank's stage beside what dhelix-run measured (the trace's otherData.memory,
// runtime/train/run_trace.h).
//
// The prediction is the dhelix scheme's (schemes[dhelix].memory, planner/memory_model.h):
// dhelix-run executes the plan's stages, which are the dhelix W layout, in both schedules.
//
// Model states are compared like with like. The plan counts, per parameter of the stage
// (planner/memory_model.h, stage_parameters): weights in the model's dtype (bf16: 2 bytes),
// fp32 main gradients (4) and Adam's fp32 master weights, first and second moments (12),
// the optimizer states split over dp x cp with the distributed optimizer (the plan's
// options.distributed_optimizer; experts over dp x cp x tp / (ep x expert tp)). A backend
// states its own sizes (runtime/memory/memory_report.h): the CPU keeps fp32 master weights
// that its ops read (4 bytes), fp32 gradients (4) and AdamW's two fp32 moments (8, the
// master weights being the weights), on one shard; CUDA adds a bf16 compute copy (6). So
// each term's parameter count, measured bytes x measured shards / measured bytes per
// parameter, must equal the plan's exactly: a different count is a failure (the run holds
// another model than the plan), a different byte count at equal parameters is explained
// by the bytes per parameter and the shards, which the rows show.
//
// Activations: the plan's peak of live activations for the stage, in the model's dtype;
// a backend whose activation elements have another size (the CPU's fp32 against a bf16
// plan) scales it by activation_element_bytes / dtype bytes before comparing (the fp32
// logits and router probabilities the plan counts as fp32 scale too: an overestimate of
// at most the head's transient). Two rows: the activation arena (the measured
// high-water mark) and the live peak (the most bytes live at once, its lower bound), both
// against the same prediction.
//
// Worked case (tests/emitter/measured_memory_test.cc): tiny-tp2 (h 64, ffn 128, 4 layers,
// 4 heads of 16, 2 KV heads, vocab 256, tp 2, fp32) holds 4 x 18560 + 8192 + 64 + 8192 =
// 90688 parameters per rank: the plan predicts 362752 bytes of weights (4 per parameter)
// and 1088256 of optimizer states (12); the CPU measures 362752 and 725504 (8): equal
// parameters, optimizer states -33.3 %, explained.
//
// error = (measured - predicted) / predicted, in percent.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lib/json_reader.h"
#include "lib/plan/plan.h"

namespace dhelix {

/// One term of one rank.
struct MemoryTermRow {
  std::string term;  ///< "weights", "gradients", "optimizer states", "activations (arena)", ...
  int64_t predicted_bytes = 0;
  int64_t measured_bytes = 0;
  /// Model-state terms only: the parameters each side holds the term for, its bytes per
  /// parameter and the ranks it is split over (the plan's dense shards).
  std::optional<int64_t> predicted_parameters;
  std::optional<int64_t> measured_parameters;  ///< absent: not a whole number
  int64_t predicted_bytes_per_parameter = 0;
  int64_t measured_bytes_per_parameter = 0;
  int64_t predicted_shards = 1;
  int64_t measured_shards = 1;
  /// Optimizer states of a MoE stage: the plan's expert parameters (part of
  /// predicted_parameters) and the ranks their states are split over.
  int64_t predicted_expert_parameters = 0;
  int64_t predicted_expert_shards = 1;
  /// (measured - predicted) / predicted x 100; absent when nothing is predicted.
  std::optional<double> error_pct() const;
  /// Model-state terms: the parameter counts are equal (true for activation rows).
  bool parameters_match() const;
};

struct RankMemoryDiff {
  int64_t rank = 0;
  int64_t stage = 0;
  int64_t activation_element_bytes = 0;       ///< measured
  int64_t plan_activation_element_bytes = 0;  ///< the model's dtype
  int64_t buffers = 0;                        ///< the arena's buffers (0: no arena recorded)
  std::vector<MemoryTermRow> terms;           ///< weights, gradients, optimizer, activations
};

struct MeasuredMemory {
  std::string scheme;  ///< "dhelix"
  std::vector<RankMemoryDiff> ranks;
  /// One line per rank and term whose parameter count differs from the plan's.
  std::vector<std::string> mismatches;
};

/// The trace's otherData.memory against `plan`; nullopt when the trace has none (a trace of
/// a dhelix-run before it recorded memory). Throws Error(kInvalidInput) naming the trace
/// and the field when a record is malformed or names a rank or stage the plan lacks.
std::optional<MeasuredMemory> compare_memory(const Plan& plan, const Json& trace,
                                             const std::string& trace_label);

/// The section of dhelix-diff's text: a header stating what each side counts, then per
/// rank a table of the terms (MiB, error, parameters, bytes per parameter, shards).
std::string measured_memory_text(const std::optional<MeasuredMemory>& memory);

/// {"scheme", "ranks": [{"rank", "stage", "activation_element_bytes",
/// "plan_activation_element_bytes", "buffers", "terms": [{"term", "predicted_bytes",
/// "measured_bytes", "error_pct", "predicted_parameters", "measured_parameters",
/// "parameters_match", "predicted_bytes_per_parameter", "measured_bytes_per_parameter",
/// "predicted_shards", "measured_shards", "predicted_expert_parameters",
/// "predicted_expert_shards"}]}], "mismatches"}; null without a record.
OrderedJson measured_memory_json(const std::optional<MeasuredMemory>& memory);

}  // namespace dhelix
