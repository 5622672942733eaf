#include "runtime/train/verification.h"

#include <fmt/format.h>

#include <bit>
#include <cstdint>

namespace dhelix::rt {
namespace {

std::string float_text(float value) {
  return fmt::format("{:.9g} (0x{:08x})", value, std::bit_cast<uint32_t>(value));
}

// Index of the first element whose bits differ, or -1.
int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

}  // namespace

IterationSnapshot take_snapshot(StageModel& model) {
  IterationSnapshot snapshot;
  snapshot.losses = model.micro_batch_losses();
  for (const ParameterView& param : model.parameters()) {
    snapshot.names.push_back(param.name);
    snapshot.gradients.emplace_back(param.gradient, param.gradient + param.count);
  }
  return snapshot;
}

std::optional<std::string> first_difference(const IterationSnapshot& expected,
                                            const IterationSnapshot& actual) {
  if (expected.losses.size() != actual.losses.size()) {
    return fmt::format("{} micro-batch losses vs {}", expected.losses.size(), actual.losses.size());
  }
  if (int64_t i = first_bit_difference(expected.losses, actual.losses); i >= 0) {
    return fmt::format("loss of micro-batch {} differs: {} vs {}", i,
                       float_text(expected.losses[static_cast<size_t>(i)]),
                       float_text(actual.losses[static_cast<size_t>(i)]));
  }
  for (size_t t = 0; t < expected.gradients.size() && t < actual.gradients.size(); ++t) {
    const auto& a = expected.gradients[t];
    const auto& b = actual.gradients[t];
    if (a.size() != b.size()) {
      return fmt::format("gradient of {} has {} elements vs {}", expected.names[t], a.size(),
                         b.size());
    }
    if (int64_t i = first_bit_difference(a, b); i >= 0) {
      const auto at = static_cast<size_t>(i);
      return fmt::format("gradient of {} differs at element {}: {} vs {}", expected.names[t], i,
                         float_text(a[at]), float_text(b[at]));
    }
  }
  return std::nullopt;
}

}  // namespace dhelix::rt
