#include "profiler/sampling.h"

#include <algorithm>
#include <cmath>

#include "lib/error.h"

namespace dhelix::sampling {
namespace {

// Scales a MAD to a normal distribution's standard deviation.
constexpr double kMadToSigma = 1.4826;
// The MAD is floored at this share of the median (see the file comment).
constexpr double kMadFloorOfMedian = 0.01;

}  // namespace

double quantile(const std::vector<double>& sorted, double q) {
  DHELIX_CHECK(!sorted.empty() && q >= 0 && q <= 1);
  const double position = q * static_cast<double>(sorted.size() - 1);
  const auto below = static_cast<size_t>(std::floor(position));
  const size_t above = std::min(below + 1, sorted.size() - 1);
  const double fraction = position - static_cast<double>(below);
  return sorted[below] + fraction * (sorted[above] - sorted[below]);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return quantile(values, 0.5);
}

TimeStats summarize(std::vector<double> samples_us) {
  DHELIX_CHECK(!samples_us.empty());
  std::sort(samples_us.begin(), samples_us.end());
  return {.median_us = quantile(samples_us, 0.5),
          .p10_us = quantile(samples_us, 0.1),
          .p90_us = quantile(samples_us, 0.9),
          .min_us = samples_us.front(),
          .max_us = samples_us.back()};
}

void check_sampling_policy(const SamplingPolicy& policy) {
  DHELIX_CHECK(policy.warmup >= 0);
  DHELIX_CHECK(policy.min_samples >= 1 && policy.min_samples <= policy.max_samples);
  DHELIX_CHECK(policy.batch >= 1);
  DHELIX_CHECK(policy.target_relative_ci > 0);
}

MedianInterval median_confidence_interval(const std::vector<double>& sorted) {
  DHELIX_CHECK(!sorted.empty());
  const auto n = static_cast<double>(sorted.size());
  const double spread = kZ95 * std::sqrt(n);
  // 1-based ranks of the order statistics, clamped into the sample.
  const double r = std::max(1.0, std::floor((n - spread) / 2));
  const double s = std::min(n, std::ceil(1 + (n + spread) / 2));
  return {.low = sorted[static_cast<size_t>(r) - 1], .high = sorted[static_cast<size_t>(s) - 1]};
}

double relative_ci_half_width(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  const double mid = quantile(samples, 0.5);
  if (mid <= 0) return 0;
  const MedianInterval interval = median_confidence_interval(samples);
  return (interval.high - interval.low) / (2 * mid);
}

int64_t samples_to_add(const std::vector<double>& samples, const SamplingPolicy& policy) {
  check_sampling_policy(policy);
  const auto n = static_cast<int64_t>(samples.size());
  if (n < policy.min_samples) return policy.min_samples - n;
  if (n >= policy.max_samples) return 0;
  if (relative_ci_half_width(samples) <= policy.target_relative_ci) return 0;
  return std::min(policy.batch, policy.max_samples - n);
}

OutlierSplit remove_outliers(const std::vector<double>& samples) {
  DHELIX_CHECK(!samples.empty());
  const double mid = median(samples);
  std::vector<double> deviations;
  deviations.reserve(samples.size());
  for (double x : samples) deviations.push_back(std::abs(x - mid));
  const double mad = median(deviations);
  const double sigma = kMadToSigma * std::max(mad, kMadFloorOfMedian * std::abs(mid));
  OutlierSplit split;
  for (double x : samples) {
    if (std::abs(x - mid) <= kOutlierMads * sigma) {
      split.kept.push_back(x);
    } else {
      ++split.outliers;
    }
  }
  // Only all-zero samples have sigma 0, and then every sample equals the median.
  DHELIX_CHECK(!split.kept.empty());
  return split;
}

RankSpread rank_spread(const std::vector<double>& per_rank_us) {
  DHELIX_CHECK(!per_rank_us.empty());
  const auto slowest = std::max_element(per_rank_us.begin(), per_rank_us.end());
  return {.min_us = *std::min_element(per_rank_us.begin(), per_rank_us.end()),
          .median_us = median(per_rank_us),
          .max_us = *slowest,
          .slowest_rank = static_cast<int64_t>(slowest - per_rank_us.begin())};
}

}  // namespace dhelix::sampling
