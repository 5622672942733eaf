#pragma once
// The planner's top level: from a validated job and a profile to a Plan (lib/plan/plan.h).
//
//   1. check that the profile covers every op the job needs (profile_co_run.h)
//   2. fold the layers (W) and unfold them (1F1B); each stage's DAG shapes are those of the
//      first rank of its pipeline coordinate
//   3. per distinct stage shape: the layer-level searches of the schemes (layer_costs.h),
//      one pairing record each
//   4. per scheme: stage costs (chunks, SI blocks, embedding, head and loss, p2p, DP
//      gradient reduction, optimizer step), the pipeline simulation, memory and metrics
//   5. the dhelix plan must fit in memory: Error(kInfeasible) naming every term, unless
//      allow_oom (then a warning)
//   6. every stage's task list with predicted times and the p2p waits between stages
//
// Costs no profile holds (pipeline send/recv of activations and gradients, DP gradient
// collectives) come from `unprofiled_op_time_us`, which dhelix-plan binds to the analytic
// collective model (profiler/interference.h: op_time_us). The optimizer step is memory-bound
// Adam: per parameter of the optimizer shard 30 bytes move (fp32 gradient read 4, master
// weight, m and v read and written 24, bf16 weight written 2) at the GPU's usable bandwidth.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lib/job_spec.h"
#include "lib/plan/plan.h"
#include "lib/plan/scheme_timeline.h"
#include "lib/profile.h"
#include "planner/memory_model.h"
#include "planner/pairing_memo.h"

namespace dhelix {

/// Everything build_plan needs.
struct PlanRequest {
  const JobSpec* job = nullptr;              ///< validated (validate_job)
  const Profile* profile = nullptr;          ///< solo and pair times of the job's ops
  std::string profile_name;                  ///< for messages: the profile file, or a description
  PlanInputRef profile_ref;                  ///< backend and sha256 (or "generated:model")
  OrderedJson meta = OrderedJson::object();  ///< provenance of this run
  /// Time of an op no profile holds (p2p transfers, DP gradient collectives), in us.
  std::function<double(const Op&)> unprofiled_op_time_us;
  /// Write a plan that does not fit in memory (with a warning) instead of refusing it.
  bool allow_oom = false;
  /// Memory model options; Megatron's distributed optimizer is on by default (the paper's
  /// settings do not fit without it on A40).
  MemoryOptions memory = [] {
    MemoryOptions o;
    o.distributed_optimizer = true;
    return o;
  }();
  /// Segment bound of the cross-layer ("chunk") scope search.
  int64_t cross_layer_max_segment_ops = 8;
  /// Pairing searches shared with other plans of the same cluster and profile generator
  /// (planner/pairing_memo.h; the configuration search sets it); nullptr: search afresh.
  PairingMemo* pairing_memo = nullptr;
  /// Called with (steps done, steps in all) as planning goes: one step per stage's layer
  /// search, per scheme simulated, and for the task lists. May be empty.
  std::function<void(int64_t done, int64_t total)> progress;
  /// Megatron's --virtual-pipeline-model-parallel-size for the interleaved 1F1B baseline; 0:
  /// default_virtual_pipeline_size (planner/baseline_schedules.h). It must divide the layers
  /// per stage, and m must be a multiple of pp (Error(kInvalidInput) otherwise).
  int64_t virtual_pipeline_size = 0;
  /// The shapes the dhelix plan may take (planner/dhelix_shapes.h): auto picks the faster
  /// of the W and the V that fits.
  ShapeRequest shape = ShapeRequest::kAuto;
  /// False (--no-split-backward): the dhelix plan keeps whole backwards, so it is the W as
  /// the paper runs it (the V splits backwards by construction).
  bool split_backward = true;
  /// Return every scheme's simulated timeline (PlanResult::timelines), for pictures; off by
  /// default, since the configuration search builds thousands of plans.
  bool keep_timelines = false;
};

/// A plan and what the user should know about it.
struct PlanResult {
  Plan plan;
  std::vector<std::string> warnings;
  std::vector<SchemeTimeline> timelines;  ///< in plan.schemes order, with keep_timelines
};

/// Builds the plan (see the file comment). Errors: kInvalidInput (profile lacks ops, layers
/// do not fold), kUnsupported (a layer too large for the search), kInfeasible (memory).
PlanResult build_plan(const PlanRequest& request);

/// The time of one Adam step over `shard_parameters` parameters on `gpu`, in us.
double optimizer_step_us(const GpuSpec& gpu, int64_t shard_parameters);

}  // namespace dhelix
