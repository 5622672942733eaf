#include "runtime/train/gradient_buckets.h"

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix::rt {

std::vector<GradientBucket> plan_gradient_buckets(const std::vector<int64_t>& sizes,
                                                  int64_t bucket_elements) {
  if (bucket_elements < 1) {
    throw Error(
        ErrorCode::kInvalidInput,
        fmt::format("--ddp-bucket-size: {} is not a positive number of elements", bucket_elements));
  }
  std::vector<GradientBucket> buckets;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t size = sizes[i];
    if (size < 0) {
      throw Error(ErrorCode::kInvalidInput, fmt::format("parameter {} has {} elements", i, size));
    }
    const bool fits = !buckets.empty() && buckets.back().elements + size <= bucket_elements;
    if (!fits) {
      buckets.emplace_back();
      buckets.back().first = static_cast<int64_t>(i);
    }
    GradientBucket& bucket = buckets.back();
    bucket.offsets.push_back(bucket.elements);
    bucket.elements += size;
    ++bucket.count;
  }
  return buckets;
}

}  // namespace dhelix::rt
