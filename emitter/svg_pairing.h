#pragma once
// One layer's pairing as an SVG picture: how the forward of one layer (micro-batch j) and the
// backward of another layer (micro-batch j - pp) are cut into SI blocks and co-run.
//
// Three lanes, compute, local comm and cross comm, with time to the right; each SI block's
// ops in their lanes, blocks side by side, barriers as dashed vertical lines. Forward-strand
// ops are blue, backward-strand ops orange. Communication that overlaps computation of the
// same block is drawn hatched (hidden); the part of a communication op with no computation
// beside it is red (exposed) and labelled with its time. Under the lanes a caption gives the
// block times, the pair's time against running the two strands one after the other, and a
// table says which computation each communication op hides under.
//
// When the stage costs use the cross-layer ("chunk") scope, a second panel shows one window
// of window_layers layers the same way (op labels then carry the window layer, "L1.").

#include <cstdint>
#include <string>
#include <vector>

#include "lib/plan/plan.h"

namespace dhelix {

/// How one communication op of a block sits against the block's computation.
struct CommOverlap {
  std::string op;  ///< op id as in the block ("L1.bwd.allgather_mlp" in a window)
  Pass strand = Pass::kForward;
  int64_t block = 0;                      ///< index of the block in its list
  double time_us = 0;                     ///< finish - start
  double exposed_us = 0;                  ///< time with no compute op of the block running
  std::vector<std::string> hidden_under;  ///< compute ops it overlaps, in start order
};

/// Every communication op of `blocks` (ops looked up in `pairing`), in block then start order.
/// Throws Error(kInvalidInput) when a timing names an op the pairing lacks.
std::vector<CommOverlap> comm_overlaps(const PlanPairing& pairing,
                                       const std::vector<PlanBlock>& blocks);

/// The pairing picture of plan.pairings[pairing_index] as a complete SVG document. Throws
/// Error(kInvalidInput) when the index is out of range or a timing names an unknown op.
std::string pairing_svg(const Plan& plan, int64_t pairing_index = 0);

}  // namespace dhelix
