#pragma once
// What build_plan hands out besides the plan about the schemes it simulated: each scheme's
// timeline for pictures (lib/plan/scheme_timeline.h, emitter/svg_schemes.h), and the chunk
// times ZB-V's greedy order is built on (baseline_schedules.h), from the simulator's stage
// costs.

#include <string>
#include <vector>

#include "lib/plan/scheme_timeline.h"
#include "planner/baseline_schedules.h"
#include "planner/pipeline_simulator.h"

namespace dhelix {

/// The timeline of `simulation` (of `schedule`) under the name `scheme`, one box per task.
SchemeTimeline scheme_timeline(PipelineScheme scheme, const PipelineSchedule& schedule,
                               const PipelineSimulation& simulation);

/// Per stage: its chunks' forward, input-gradient and weight-gradient times (the up chunk
/// scaled to its layers; the embedding added to stage 0's down chunk), the head-loss step
/// and the transfer time, from the stage costs the simulator is given.
std::vector<GreedyStageTimes> greedy_stage_times(const std::vector<StageCosts>& costs);

}  // namespace dhelix
