#pragma once
// Every scheme a plan compares, as one SVG picture: a panel per scheme (dhelix, wavelet+,
// intra-batch, Megatron 1F1B and interleaved 1F1B, ZB-H1, ZB-V, DualPipeV), one row per
// stage, time to the right on one scale for all panels, so that the idle gaps (the bubbles)
// and the iteration ends compare at a glance. Boxes are coloured by what they do: forward
// blue, whole backward orange, the zero-bubble split's input gradient I light orange and
// weight gradient W brown, co-run forward and backward (DHelix's SI blocks, DualPipeV's
// overlapped pairs) purple, head and loss grey; labels ("F3d", "I2", "F5d+B1u") are drawn
// where the box is wide enough; tasks too short to draw apart are drawn as one grey-violet run
// (the gaps between runs, the bubbles, stay visible). dhelix-plan --svg PREFIX writes it as
// PREFIX-schemes.svg.

#include <string>
#include <vector>

#include "lib/plan/scheme_timeline.h"

namespace dhelix {

/// The picture of `timelines` (at least one, each with at least one stage) as a complete SVG
/// document titled `title`.
std::string schemes_svg(const std::vector<SchemeTimeline>& timelines, const std::string& title);

}  // namespace dhelix
