#include "lib/moe_routing.h"

#include <algorithm>

namespace dhelix {

double moe_load_imbalance(const ModelSpec& model, const ParallelSpec& parallel) {
  if (!model.moe) return 1.0;
  const double requested = parallel.moe_load_imbalance.value_or(kDefaultMoeLoadImbalance);
  const double cap = model.moe->capacity_factor;
  return std::max(1.0, cap > 0 ? std::min(requested, cap) : requested);
}

}  // namespace dhelix
