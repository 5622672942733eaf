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

ProfiledPair pair_from_samples(const std::string& a, const std::string& b, double solo_a_us,
                               double solo_b_us, const std::vector<PairSample>& samples,
                               PairAdjustment* adjustment) {
  DHELIX_CHECK(!samples.empty() && solo_a_us >= 0 && solo_b_us >= 0);
  std::vector<double> finish_a, finish_b;
  for (const PairSample& s : samples) {
    finish_a.push_back(s.finish_a_us);
    finish_b.push_back(s.finish_b_us);
  }
  PairAdjustment applied = PairAdjustment::kNone;
  // The reader recomputes the OEF from the quantized solo medians: work with those.
  const double t_a = quantize_profile_value(solo_a_us);
  const double t_b = quantize_profile_value(solo_b_us);
  double f_a = quantize_profile_value(median(finish_a));
  double f_b = quantize_profile_value(median(finish_b));
  if (f_a < t_a || f_b < t_b) applied = PairAdjustment::kRaisedToSolo;
  f_a = std::max(f_a, t_a);
  f_b = std::max(f_b, t_b);
  const double cap = quantize_profile_value(std::max(t_a, t_b) + 2 * std::min(t_a, t_b));
  if (std::max(f_a, f_b) > cap) {
    applied = PairAdjustment::kCappedAtOefMinusOne;
    f_a = std::min(f_a, cap);
    f_b = std::min(f_b, cap);
  }
  if (adjustment != nullptr) *adjustment = applied;
  const double makespan = std::max(f_a, f_b);
  const double oef = std::clamp(overlap_effectiveness(t_a, t_b, makespan), -1.0, 1.0);
  return {.a = a,
          .b = b,
          .finish_a_us = f_a,
          .finish_b_us = f_b,
          .makespan_us = makespan,
          .oef = quantize_profile_value(oef)};
}

}  // namespace dhelix::sampling
