#pragma once
// Which parallel configuration should a job use? The search plans every configuration of
// the space (planner/config_space.h) that the job's rules allow, under DHelix and under
// Megatron-LM 1F1B, and ranks each scheme's configurations that fit in memory by
// iteration time. Co-execution changes the answer where hidden TP/CP/EP communication
// makes larger groups (less memory, fewer stages, smaller bubbles) pay.
//
// Every configuration ends in one of four states, in this order of tests:
//
//   invalid    the job's rules refuse it (lib/job_validation.h), reason = the first rule
//   no-memory  weights, gradients and optimizer states alone exceed the usable memory on
//              some stage under both layouts (no activation could fit), or with the
//              activations in flight neither scheme's plan would fit (planner/scheme_memory.h:
//              exact, known before planning): not planned
//   pruned     neither scheme's lower bound beats that scheme's k-th best iteration
//              found so far (a scheme whose plan would not fit cannot): not planned
//   planned    build_plan ran; the plan says whether each scheme fits
//
// The lower bounds: planner/search_bounds.h.
//
// Order and determinism. The candidates that survive the first two tests are sorted by
// (smaller bound, enumeration index) and planned in fixed batches (SearchRequest::batch), the
// batch's configurations spread over the threads; after each batch the k-th best times are updated
// and the rest pruned against them. Batches do not depend on the thread count, so the set planned,
// the figures and the ranking are the same for any number of threads. Ranking ties (equal iteration
// time) go to the configuration enumerated first. Pruning is exact: a pruned configuration's bound
// under each scheme exceeds that scheme's k-th best time, so it could not have entered either top-k
// list.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lib/job_spec.h"
#include "lib/plan/plan_kinds.h"
#include "lib/profile.h"
#include "planner/config_space.h"
#include "planner/search_bounds.h"

namespace dhelix {

enum class ConfigStatus { kInvalid, kNoMemory, kPruned, kPlanned };
const char* config_status_name(ConfigStatus status);  ///< "invalid", "no-memory", ...

/// One scheme's figures for a planned configuration.
struct SearchSchemeFigures {
  double iteration_us = 0;
  double tokens_per_second = 0;
  double tflops_per_gpu = 0;
  double mfu = 0;
  double bubble_ratio = 0;
  double exposed_comm_us = 0;  ///< per GPU of an average stage, all communication types
  int64_t peak_memory_bytes = 0;
  bool fits = false;
  PipelineShape shape = PipelineShape::kW;  ///< the dhelix plan's chosen shape; 1f1b for Megatron
};

struct ConfigOutcome {
  int64_t index = 0;  ///< position in enumeration order
  ParallelSpec parallel;
  std::string label;  ///< configuration_label
  ConfigStatus status = ConfigStatus::kInvalid;
  std::string reason;   ///< why invalid / no-memory / pruned; "" when planned
  SchemeBounds bounds;  ///< zeros when not computed (invalid, no-memory)
  // dhelix / megatron: a no-memory configuration rejected for its activations has each
  // scheme's peak_memory_bytes (its largest stage) set, and nothing else.
  SearchSchemeFigures dhelix;    ///< planned only
  SearchSchemeFigures megatron;  ///< planned only
  /// The plan's other schemes (Wavelet+, intra-batch, ...) by name, in the plan's order;
  /// planned only. Pruning keeps only dhelix's and Megatron's top k exact, so the best of
  /// these is the best among the configurations planned.
  std::vector<std::pair<std::string, SearchSchemeFigures>> baselines;
};

/// Everything the search needs. The two callbacks keep the planner free of the profiler:
/// dhelix-plan binds them to the analytic model (profiler/model_backend.h and
/// profiler/interference.h).
struct SearchRequest {
  JobSpec base;  ///< model, cluster, gbs, seq, cost-model settings (parallel sizes ignored)
  int64_t gpus = 0;
  SearchConstraints constraints;
  int64_t top_k = 5;    ///< the pruning keeps this many of each scheme exact
  int64_t threads = 1;  ///< >= 1
  bool prune = true;    ///< false: plan every candidate (what the tests compare against)
  int64_t batch = 16;   ///< configurations planned together between two pruning steps, >= 1
  /// The dhelix plans' shapes (planner/dhelix_shapes.h): auto weighs the W, the V and
  /// interleaved stages.
  ShapeRequest shape = ShapeRequest::kAuto;
  std::function<Profile(const JobSpec&)> make_profile;
  std::function<double(const ClusterSpec&, const Op&)> unprofiled_op_time_us;
  /// An op's solo time exactly as make_profile's profiles hold it, in us (the lower bound).
  SoloTime solo_time_us;
  /// Called after each batch with (configurations decided, candidates); may be empty.
  std::function<void(int64_t done, int64_t total)> progress;
};

struct SearchCounts {
  int64_t enumerated = 0;
  int64_t invalid = 0;
  int64_t no_memory = 0;
  int64_t pruned = 0;
  int64_t planned = 0;
  int64_t dhelix_fits = 0;    ///< planned configurations whose dhelix plan fits
  int64_t megatron_fits = 0;  ///< ... whose Megatron-1F1B plan fits
};

struct SearchResult {
  std::vector<ConfigOutcome> configs;  ///< every configuration, in enumeration order
  SearchCounts counts;
  /// Indices into `configs` of the fitting configurations, fastest first (ties: lower
  /// index first), at most top_k each.
  std::vector<int64_t> dhelix_ranking;
  std::vector<int64_t> megatron_ranking;
  /// The most common reasons for invalid and no-memory configurations, with counts,
  /// most frequent first (ties: alphabetical).
  std::vector<std::pair<std::string, int64_t>> rejection_reasons;

  const ConfigOutcome* best_dhelix() const;
  const ConfigOutcome* best_megatron() const;
};

/// Runs the search (see the file comment). Errors: kInvalidInput for a bad request (gpus or
/// threads < 1, top_k < 1, more GPUs than a cluster of fixed size has) and for a space with
/// no configuration (the message says why: empty_space_reason); errors of build_plan other
/// than memory propagate.
SearchResult search_configurations(const SearchRequest& request);

/// Why `scheme`'s ranking (kDHelix or kMegatron1F1B) is empty, from the counts: every
/// configuration broke a rule of the job, or "none fits in memory: N configurations refused
/// on memory (...)"; "" when the ranking is not empty.
std::string no_best_reason(const SearchResult& result, PipelineScheme scheme);

/// The job of one configuration: `base` with its parallel settings replaced.
JobSpec configuration_job(const JobSpec& base, const ParallelSpec& parallel);

}  // namespace dhelix
