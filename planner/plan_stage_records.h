#pragma once
// The dhelix plan's stages and task lists, written from the scheme's schedule and its
// simulation: for each stage its ranks, its layers (the folded layout's down and up chunks),
// the pairing its layers use, and every task in order with its predicted start and end and
// the tasks of other stages it waits for (each such wait is one point-to-point transfer,
// which dhelix-run turns into a send and a receive).
//
// Example, pp 2, 4 layers folded (stage 0 holds layers 0 and 3, stage 1 layers 1 and 2):
// stage 1's task F0d (micro-batch 0, down chunk: layer 1) waits for stage 0's F0d (layer
// 0's output), and stage 0's F0u (layer 3) waits for stage 1's F0u (layer 2's output).
//
// On interleaved stages (the dhelix plan's third shape, planner/dhelix_shapes.h) a stage
// lists its model chunks instead (chunk c of stage p is virtual stage c·pp + p), and each
// task part names its model chunk. pp 2, v 2, 8 layers: stage 0 holds layers 0-1 and 4-5,
// stage 1 layers 2-3 and 6-7; stage 0's F0.1 (layers 4-5) waits for stage 1's F0.0 (layer
// 3's output), stage 1's B0.0 for stage 0's B0.1 (the gradient of layer 4's input).

#include <cstdint>
#include <vector>

#include "lib/placement.h"
#include "lib/plan/plan.h"
#include "planner/folding.h"
#include "planner/pipeline_schedule.h"
#include "planner/pipeline_simulator.h"

namespace dhelix {

/// What the stage records are made of (all owned by the caller).
struct StageRecordInputs {
  const PipelineSchedule& schedule;              ///< the scheme's tasks per stage
  const PipelineSimulation& simulation;          ///< their predicted times, task by task
  const std::vector<PlanStagePhases>& phases;    ///< per stage
  const Placement& placement;                    ///< which ranks each stage has
  const FoldedLayout& folded;                    ///< down and up chunks per stage
  const UnfoldedLayout& unfolded;                ///< the whole chunk per stage (1F1B-shaped tasks)
  const std::vector<int64_t>& shape_ranks;       ///< per stage: the rank whose shapes were used
  const std::vector<int64_t>& pairing_of_stage;  ///< per stage: index into the plan's pairings
  /// Interleaved schedules: each stage's model chunks' layer counts (Context's
  /// interleaved_layers); unused otherwise.
  const std::vector<std::vector<int64_t>>* model_chunk_layers = nullptr;
};

/// One PlanStage per pipeline stage, in stage order (see the file comment).
std::vector<PlanStage> stage_records(const StageRecordInputs& in);

}  // namespace dhelix
