#pragma once
// The simulated task timeline of every scheme a plan compares, for pictures
// (emitter/svg_schemes.h). Not part of the plan file: only the dhelix scheme's tasks are
// stored there (they are what dhelix-run executes); the baselines' timelines exist only
// while dhelix-plan runs, and only when asked for (PlanRequest::keep_timelines).

#include <string>
#include <vector>

#include "lib/plan/plan_kinds.h"

namespace dhelix {

/// What a box of a scheme's timeline does.
enum class TimelineBoxKind {
  kForward,
  kBackward,        ///< a whole backward (input and weight gradients)
  kInputGradient,   ///< the zero-bubble schedules' I
  kWeightGradient,  ///< the zero-bubble schedules' W
  kSiBlock,         ///< a forward and a backward of two micro-batches co-run
  kHeadLoss,
};

/// One task as the simulator timed it, in microseconds from the iteration's start.
struct TimelineBox {
  std::string label;  ///< "F3d", "I2", "F5d+B1u", "F3.1", ...
  TimelineBoxKind kind = TimelineBoxKind::kForward;
  double start_us = 0;
  double end_us = 0;
};

/// One scheme's iteration: every stage's boxes in execution order.
struct SchemeTimeline {
  PipelineScheme scheme = PipelineScheme::kDHelix;
  double iteration_us = 0;
  double bubble_ratio = 0;
  std::vector<std::vector<TimelineBox>> stages;
};

}  // namespace dhelix
