#include "planner/dp_overlap.h"

#include <algorithm>

#include "lib/error.h"

namespace dhelix {
namespace {

constexpr int64_t kMinBucketParameters = 40'000'000;
constexpr int64_t kBucketParametersPerDpRank = 1'000'000;

// Exposed part of `total_us` split into `buckets` equal pieces that queue behind a window.
double exposed_after(double total_us, int64_t buckets, double window_us) {
  return std::max(total_us / static_cast<double>(buckets), total_us - window_us);
}

}  // namespace

int64_t megatron_dp_bucket_parameters(int64_t dp_group_size) {
  return std::max(kMinBucketParameters, kBucketParametersPerDpRank * dp_group_size);
}

int64_t megatron_dp_buckets(int64_t parameters, int64_t dp_group_size) {
  const int64_t bucket = megatron_dp_bucket_parameters(dp_group_size);
  return std::max<int64_t>(1, (parameters + bucket - 1) / bucket);
}

DpOverlap overlap_dp(double reduce_us, double gather_us, int64_t buckets, double backward_window_us,
                     double forward_window_us, bool overlap_grad_reduce,
                     bool overlap_param_gather) {
  DHELIX_CHECK(buckets >= 1 && reduce_us >= 0 && gather_us >= 0);
  DpOverlap out;
  const double reduce_exposed =
      overlap_grad_reduce ? exposed_after(reduce_us, buckets, backward_window_us) : reduce_us;
  const double gather_exposed =
      overlap_param_gather ? exposed_after(gather_us, buckets, forward_window_us) : gather_us;
  out.reduce_exposed_us = reduce_exposed;
  out.gather_exposed_us = gather_exposed;
  out.exposed_us = reduce_exposed + gather_exposed;
  out.hidden_us = reduce_us + gather_us - out.exposed_us;
  return out;
}

}  // namespace dhelix
