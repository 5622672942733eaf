#pragma once
// A scheme's memory per stage without its times: what the configuration search asks before
// it pays for a configuration's pairing search.
//
// A plan's memory (planner/memory_model.h) is weights, gradients and optimizer states, fixed
// by the layout, plus the peak of live activations, which the pipeline simulator finds by
// walking each stage's tasks in the schedule's order (activation_peaks in
// planner/pipeline_simulator.h). Both depend on the model, the parallel sizes, the layout's
// layers per chunk and the schedule's task order, never on how long a task takes. So the
// memory of the DHelix (W) and Megatron-LM 1F1B plans of a configuration is known exactly
// before its layers are costed, and a configuration that fits under neither scheme need
// not be planned.
//
// One set of byte fields serves both: the plan builder fills a stage's StageCosts with
// set_chunk_memory, and scheme_memory fills the same fields the same way, so the two agree
// byte for byte (tests/planner/scheme_memory_test.cc checks it against build_plan).
//
// Worked case (tests/planner/scheme_memory_test.cc): 1F1B's stage 0 of pp 4 with m = 8
// micro-batches of 2-layer chunks runs 4 forwards before its first backward, so its peak
// is 4 chunks of activations; its last stage peaks at one chunk plus the head's logits.
// Across a whole configuration space (even and uneven stages, SP, every recompute
// setting), both schemes' stages equal the plans' term by term.

#include <cstdint>
#include <vector>

#include "lib/job_spec.h"
#include "lib/plan/plan.h"
#include "lib/plan/plan_kinds.h"
#include "planner/memory_model.h"
#include "planner/pipeline_simulator.h"

namespace dhelix {

/// Sets the byte fields of `costs` for a stage whose first (down or whole) chunk has
/// `layers` layers and whose up chunk has `up_layers` (0: no up chunk, or the same count),
/// under `parallel.recompute`: layers_per_chunk, activation_bytes_per_layer, up_layers,
/// the kept chunk bytes and the backward's recompute transient. Times are left alone.
void set_chunk_memory(const ModelSpec& model, const ParallelSpec& parallel, int64_t layers,
                      int64_t up_layers, const MemoryOptions& options, StageCosts& costs);

/// Interleaved 1F1B with model chunks of differing layers (`layers`, one per model chunk):
/// sets model_chunk_layers and the bytes each keeps on `costs` (after set_chunk_memory for
/// the largest chunk); chunks of equal layers leave them empty.
void set_model_chunk_memory(const ModelSpec& model, const ParallelSpec& parallel,
                            const std::vector<int64_t>& layers, const MemoryOptions& options,
                            StageCosts& costs);

/// Every stage's memory under `scheme` (DHelix or Megatron-LM 1F1B: the W with whole
/// backwards and the 1F1B layout), exactly as build_plan reports it for `job` (validated:
/// its stages split) when the dhelix plan takes that W: the shape the configuration search
/// tests memory with before planning (the V and the split W, planner/dhelix_shapes.h, keep
/// as much on the shipped jobs; a plan's own figures come from schedule_memory).
std::vector<StageMemory> scheme_memory(const JobSpec& job, PipelineScheme scheme,
                                       const MemoryOptions& options);

/// Every stage's memory when `schedule` (a folded W or V, 1F1B, or interleaved stages with
/// schedule.model_chunks chunks each) runs `job`: the plan's
/// own task order, whatever shape and split the planner chose.
std::vector<StageMemory> schedule_memory(const JobSpec& job, const PipelineSchedule& schedule,
                                         const MemoryOptions& options);

/// The dhelix plan's task lists read back into a schedule (the inverse of
/// plan_stage_records.h): each task's kind, micro-batches, chunks and backward share, in
/// order; the shape is the dhelix scheme's (the W when the plan lacks it).
PipelineSchedule schedule_of_plan(const Plan& plan);

}  // namespace dhelix
