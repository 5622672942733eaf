#pragma once
// The W with a split drain: the zero-bubble split (Qi et al., ICLR 2024) applied to the W's
// lone backwards, so that the W's drain runs at the speed of the input gradients and the
// weight gradients fill the stages' idle time.
//
// Why the drain. The W's bubble is its ramp (forwards only, j < pp) and its drain (backwards
// only, micro-batches m-pp .. m-1). In the drain the last micro-batches' backwards walk the U
// back to stage 0: each step waits for the neighbour's input gradient, and the neighbour sends
// it only when its whole backward (dgrad and wgrad) is done. Split each lone backward B into
// I (the input gradient: what the neighbour waits for, plus the TP/CP/EP communication) and W
// (the weight-gradient GEMMs, which only the optimizer reads): the gradient leaves after I,
// so the drain's critical path shortens by a W per hop, and the W themselves run where the
// stage would otherwise wait. SI blocks keep whole backwards (the pairing search pairs whole
// layers; dhelix-run runs split halves only as lone tasks).
//
// The generator, on the stages' real costs:
//   1. every lone backward becomes I, its W deferred to the end of the stage (most deferred);
//   2. that schedule is simulated; on each stage, walking its tasks in order, the idle time
//      before a task is filled with pending W (oldest first) while they fit in it, so no task
//      starts later than in step 1's simulation; and when an I leaves more than
//      `max_deferred` W waiting, the oldest runs right after it (the memory bound: a chunk's
//      activations live until its W);
//   3. whatever W are still pending run at the end of the stage.
// The planner simulates the result for its true times and tries several bounds (plan_builder:
// the fastest that fits in memory), 0 included: W right after its I.
//
// Worked example, pp = 2, m = 4 (pipeline_schedule.h's W), forward chunks 1, backward
// chunks 2 of which W is 1, SI blocks 3, no transfer time (start times; H takes no time):
//
//   unsplit, 30:
//     stage 0  ... F2u+B0d@13 H2@16 B2u@16 F3u+B1d@19 H3@22 B3u@22 B2d@24 .. B3d@28
//     stage 1  ... F3u+B1d@16 B2u@19 B2d@21 .. B3u@24 B3d@26
//   split, 28:
//     stage 0  ... F2u+B0d@13 H2@16 I2u@16 W2u@17 F3u+B1d@19 H3@22 I3u@22 I2d@23 W3u@24
//                  I3d@25 W2d@26 W3d@27
//     stage 1  ... F3u+B1d@16 I2u@19 I2d@20 W2u@21 W2d@22 I3u@23 I3d@24 W3u@25 W3d@26
//
// Stage 1's I2d leaves at 21 instead of 23, stage 0's I3d starts at 25 instead of 28, and
// the W fill the waits that remain (stage 0's W2u before F3u+B1d, which waits for stage 1).
// On uniform costs the split drain is never slower than the unsplit W (tested on a grid).

#include <cstdint>
#include <limits>
#include <vector>

#include "planner/pipeline_schedule.h"
#include "planner/pipeline_simulator.h"

namespace dhelix {

inline constexpr int64_t kUnboundedDeferral = std::numeric_limits<int64_t>::max();

/// `w` (a W schedule, pipeline_schedule.h) with every lone backward split into I and a W
/// placed as the file comment says, at most `max_deferred` W pending per stage (0: each W
/// right after its I). `costs` has one entry per stage. Errors as simulate_pipeline.
PipelineSchedule split_w_drain(const PipelineSchedule& w, const std::vector<StageCosts>& costs,
                               int64_t max_deferred = kUnboundedDeferral);

/// Lone weight-gradient tasks in `schedule` (0: nothing split).
int64_t weight_gradient_tasks(const PipelineSchedule& schedule);

}  // namespace dhelix
