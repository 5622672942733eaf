#pragma once
// The shapes the padded MoE layout (moe_padded.h) can hold, checked once for both of its
// implementations: the CUDA kernels (runtime/cuda/moe_cuda.h, whose router's warp keeps a
// token's E logits in registers, E / 32 per lane) and their host twin
// (runtime/cpu/moe_padded_cpu.h, no bound on E). Host code.

#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "lib/error.h"
#include "runtime/kernels/moe_padded.h"

namespace dhelix::kernels {

/// Throws Error(kUnsupported) "<who>: <the limit>" for a capacity of 0, k outside [1, E], or
/// more than `max_experts` experts (0: no bound).
inline void check_padded_moe_shape(const MoePaddedShape& shape, const std::string& who,
                                   int64_t max_experts) {
  auto refuse = [&who](const std::string& what) {
    throw Error(ErrorCode::kUnsupported, who + ": " + what);
  };
  if (shape.capacity <= 0) {
    refuse(
        "the capacity is 0 (no expert would accept a token: a capacity factor this small "
        "rounds ceil(cf T k / E) to 0); raise moe.capacity_factor, or set 0 for dropless");
  }
  if (max_experts > 0 && shape.experts > max_experts) {
    refuse(fmt::format("{} experts, more than the {} the router kernels hold per warp",
                       shape.experts, max_experts));
  }
  if (shape.top_k < 1 || shape.top_k > shape.experts) {
    refuse(fmt::format("top-{} of {} experts", shape.top_k, shape.experts));
  }
}

}  // namespace dhelix::kernels
