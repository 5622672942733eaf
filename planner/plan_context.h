#pragma once
// What plan_builder.cc's steps share (internal to planner/): the planning context, and the
// scheme runs of scheme_runs.cc: each scheme's stage costs, its schedule through the pipeline
// simulator, its memory and the figures the plan records of it.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "lib/placement.h"
#include "lib/plan/plan.h"
#include "planner/co_run_model.h"
#include "planner/folding.h"
#include "planner/layer_costs.h"
#include "planner/memory_model.h"
#include "planner/pipeline_schedule.h"
#include "planner/pipeline_simulator.h"
#include "planner/plan_builder.h"
#include "planner/profile_co_run.h"

namespace dhelix::plan_detail {

// What the planner works with, shared by the steps below.
struct Context {
  const PlanRequest* request = nullptr;
  const JobSpec* job = nullptr;
  const Profile* profile = nullptr;
  std::unique_ptr<PairTimesCoRunModel> co_run;
  Placement placement;
  FoldedLayout folded;
  UnfoldedLayout unfolded;
  int64_t pp = 1;
  int64_t micro_batches = 1;
  int64_t virtual_pipeline = 1;  ///< interleaved 1F1B's model chunks per stage
  /// Interleaved 1F1B: each stage's model chunks' layers (lib/stage_split.h), when v > 1.
  std::vector<std::vector<int64_t>> interleaved_layers = {};
  std::vector<int64_t> shape_ranks;                      ///< per stage
  std::vector<std::unique_ptr<LayerAnalysis>> analyses;  ///< distinct stage shapes
  std::vector<int64_t> analysis_of_stage;                ///< index into analyses
  /// Block recompute only: the same shapes without recompute (the layers block leaves
  /// alone), by the same index; empty otherwise.
  std::vector<std::unique_ptr<LayerAnalysis>> plain_analyses;
};

/// Embedding and head-loss times, forward and backward (one micro-batch).
struct ExtraCosts {
  double embedding_forward_us = 0, embedding_backward_us = 0;
  double head_forward_us = 0, head_backward_us = 0;
};

ExtraCosts extra_costs(const Context& ctx);

/// One scheme as simulated: its schedule, timeline, memory and per-stage phases.
struct SchemeRun {
  PipelineScheme scheme = PipelineScheme::kDHelix;
  PipelineSchedule schedule;
  PipelineSimulation simulation;
  std::vector<StageMemory> memory;
  std::vector<PlanStagePhases> phases;  ///< per stage
};

/// Every stage's costs under `scheme`, and what the plan records of each (phases).
std::vector<StageCosts> stage_costs(const Context& ctx, PipelineScheme scheme,
                                    const ExtraCosts& extras, std::vector<PlanStagePhases>& phases);

/// The same on the layout of `shape` instead of the scheme's own: the dhelix plan on
/// interleaved stages (dhelix's layer costs and SI blocks on Megatron's model chunks).
std::vector<StageCosts> stage_costs(const Context& ctx, PipelineScheme scheme, PipelineShape shape,
                                    const ExtraCosts& extras, std::vector<PlanStagePhases>& phases);

/// Whether `scheme` is priced for this job: DualPipeV needs m >= 2·pp micro-batches,
/// Megatron's combined 1F1B interleaved stages where pp > 1 (combined_1f1b.h).
bool scheme_applies(const Context& ctx, PipelineScheme scheme);

/// `schedule` on `costs` (stage_costs of `scheme`), simulated, with its memory.
SchemeRun run_schedule(const Context& ctx, PipelineScheme scheme, PipelineSchedule schedule,
                       const std::vector<StageCosts>& costs,
                       const std::vector<PlanStagePhases>& phases);

/// `scheme`'s own schedule on its stage costs, simulated, with its memory.
SchemeRun run_scheme(const Context& ctx, PipelineScheme scheme, const ExtraCosts& extras);

/// Whether every stage's memory is within the budget.
bool fits(const std::vector<StageMemory>& memory, const MemoryBudget& budget);

/// The figures the plan records of `run`; megatron_us: megatron-1f1b's iteration time.
PlanScheme scheme_record(const Context& ctx, const SchemeRun& run, const MemoryBudget& budget,
                         double megatron_us);

}  // namespace dhelix::plan_detail
