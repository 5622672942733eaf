#pragma once
// The W-shaped pipeline of a plan as an SVG picture: one row per stage, time to the right,
// one box per task coloured by kind (forward, backward, SI block, head and loss) and labelled
// with its micro-batches ("F3d+B1u") where the box is wide enough. Each row's background is
// tinted by region: warm-up (before the stage's first SI block), steady (SI blocks), cool-down
// (after its last). A dashed line marks the predicted iteration end (gradient reduction and
// optimizer step included).
//
// A plan with many micro-batches has boxes too thin to read over the whole iteration, so when
// a stage holds more than kPipelineZoomTasks tasks two more panels zoom into the start
// (warm-up into the first steady blocks) and the end (the last steady blocks into cool-down).

#include <cstdint>
#include <string>

#include "lib/plan/plan.h"

namespace dhelix {

/// Above this many tasks on one stage the picture adds the start and end zoom panels.
inline constexpr int64_t kPipelineZoomTasks = 24;

/// The pipeline picture of `plan` as a complete SVG document.
std::string pipeline_svg(const Plan& plan);

}  // namespace dhelix
