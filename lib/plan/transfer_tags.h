#pragma once
// The tags of pipeline messages. A message is the residual stream of one micro-batch at
// one layer boundary, going up (the activation entering a layer) or down (the gradient of
// a layer's output); its tag encodes the three, so a send and its receive agree without
// any order between them:
//
//   tag = (micro_batch * (num_layers + 2) + (layer + 1)) * 2 + (gradient ? 1 : 0)
//
// layer runs from -1 (the embedding's output gradient) to num_layers (the head's input),
// hence num_layers + 2 boundaries. With 4 layers: micro-batch 1's activation into layer 2
// is (1 * 6 + 3) * 2 = 18; micro-batch 0's gradient of the embedding's output is 1.

#include <cstdint>
#include <string>

namespace dhelix {

/// The tag of the pipeline message carrying micro-batch `micro_batch` across boundary
/// `layer` (see Instruction::gradient) in a model of `num_layers` layers.
int64_t transfer_tag(int64_t micro_batch, int64_t layer, bool gradient, int64_t num_layers);

/// What a transfer tag encodes.
struct TransferTagFields {
  int64_t micro_batch = 0;
  int64_t layer = 0;
  bool gradient = false;
  bool operator==(const TransferTagFields&) const = default;
};

/// The inverse of transfer_tag for a model of num_layers layers; DHELIX_CHECKs that tag is
/// non-negative and num_layers positive.
TransferTagFields decode_transfer_tag(int64_t tag, int64_t num_layers);

/// "micro-batch 1, activation into layer 4" / "micro-batch 0, gradient of layer 2's output";
/// the head's input and the embedding's output gradient are named as such.
std::string describe_transfer_tag(int64_t tag, int64_t num_layers);

}  // namespace dhelix
