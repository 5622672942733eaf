#include "lib/plan/transfer_tags.h"

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix {

int64_t transfer_tag(int64_t micro_batch, int64_t layer, bool gradient, int64_t num_layers) {
  return (micro_batch * (num_layers + 2) + (layer + 1)) * 2 + (gradient ? 1 : 0);
}

TransferTagFields decode_transfer_tag(int64_t tag, int64_t num_layers) {
  DHELIX_CHECK(tag >= 0 && num_layers > 0);
  const int64_t boundary = tag / 2;
  return {.micro_batch = boundary / (num_layers + 2),
          .layer = boundary % (num_layers + 2) - 1,
          .gradient = tag % 2 == 1};
}

std::string describe_transfer_tag(int64_t tag, int64_t num_layers) {
  const TransferTagFields f = decode_transfer_tag(tag, num_layers);
  std::string what;
  if (f.gradient) {
    what = f.layer < 0 ? "gradient of the embedding's output"
                       : fmt::format("gradient of layer {}'s output", f.layer);
  } else {
    what = f.layer >= num_layers ? "activation into the head"
                                 : fmt::format("activation into layer {}", f.layer);
  }
  return fmt::format("micro-batch {}, {}", f.micro_batch, what);
}

}  // namespace dhelix
