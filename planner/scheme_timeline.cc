#include "planner/scheme_timeline.h"

#include <utility>

#include "lib/error.h"

namespace dhelix {
namespace {

TimelineBoxKind box_kind(const PipelineTask& task) {
  switch (task.kind) {
    case TaskKind::kForward:
      return TimelineBoxKind::kForward;
    case TaskKind::kSiBlock:
      return TimelineBoxKind::kSiBlock;
    case TaskKind::kHeadLoss:
      return TimelineBoxKind::kHeadLoss;
    case TaskKind::kBackward:
      break;
  }
  switch (task.backward_split) {
    case BackwardSplit::kInput:
      return TimelineBoxKind::kInputGradient;
    case BackwardSplit::kWeight:
      return TimelineBoxKind::kWeightGradient;
    case BackwardSplit::kWhole:
      break;
  }
  return TimelineBoxKind::kBackward;
}

}  // namespace

SchemeTimeline scheme_timeline(PipelineScheme scheme, const PipelineSchedule& schedule,
                               const PipelineSimulation& simulation) {
  DHELIX_CHECK(simulation.stages.size() == schedule.stages.size());
  SchemeTimeline out;
  out.scheme = scheme;
  out.iteration_us = simulation.iteration_us;
  out.bubble_ratio = simulation.bubble_ratio;
  for (const StageSimulation& stage : simulation.stages) {
    std::vector<TimelineBox> boxes;
    for (const TimelineEntry& e : stage.timeline) {
      boxes.push_back({.label = e.task.label(),
                       .kind = box_kind(e.task),
                       .start_us = e.start_us,
                       .end_us = e.end_us});
    }
    out.stages.push_back(std::move(boxes));
  }
  return out;
}

std::vector<GreedyStageTimes> greedy_stage_times(const std::vector<StageCosts>& costs) {
  std::vector<GreedyStageTimes> out;
  for (size_t s = 0; s < costs.size(); ++s) {
    const StageCosts& c = costs[s];
    const double up = static_cast<double>(c.chunk_layers(ChunkSide::kUp)) /
                      static_cast<double>(c.layers_per_chunk);
    const double input = c.backward_chunk_us - c.backward_weight_chunk_us;
    const double embedding_forward = s == 0 ? c.embedding_forward_us : 0;
    const double embedding_backward = s == 0 ? c.embedding_backward_us : 0;
    out.push_back({.forward_down_us = c.forward_chunk_us + embedding_forward,
                   .forward_up_us = c.forward_chunk_us * up,
                   .input_down_us = input + embedding_backward,
                   .input_up_us = input * up,
                   .weight_down_us = c.backward_weight_chunk_us,
                   .weight_up_us = c.backward_weight_chunk_us * up,
                   .head_loss_us = c.head_loss_forward_us + c.head_loss_backward_us,
                   .p2p_us = c.p2p_us});
  }
  return out;
}

}  // namespace dhelix
