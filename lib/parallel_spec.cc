#include "lib/parallel_spec.h"

#include "lib/error.h"

namespace dhelix {

const char* recompute_granularity_name(RecomputeGranularity g) {
  switch (g) {
    case RecomputeGranularity::kNone:
      return "none";
    case RecomputeGranularity::kFull:
      return "full";
    case RecomputeGranularity::kSelective:
      return "selective";
  }
  DHELIX_CHECK_MSG(false, "unknown RecomputeGranularity");
  return "";
}

const char* recompute_method_name(RecomputeMethod m) {
  switch (m) {
    case RecomputeMethod::kUniform:
      return "uniform";
    case RecomputeMethod::kBlock:
      return "block";
  }
  DHELIX_CHECK_MSG(false, "unknown RecomputeMethod");
  return "";
}

std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors) {
  int64_t product = 1;
  for (int64_t factor : factors) {
    if (__builtin_mul_overflow(product, factor, &product)) return std::nullopt;
  }
  return product;
}

std::optional<int64_t> ParallelSpec::checked_world_size() const {
  return checked_product({dp, tp, cp, pp});
}

std::optional<int64_t> ParallelSpec::checked_replica_batch_size() const {
  return checked_product({micro_batch_size, dp});
}

std::string rank_order_text(const std::vector<ParallelDim>& order) {
  std::string text;
  for (ParallelDim dim : order) {
    if (!text.empty()) text += "-";
    text += parallel_dim_name(dim);
  }
  return text;
}

}  // namespace dhelix
