#pragma once
// The statistics every measuring profiler backend shares (profiler/cpu, profiler/cuda): how
// many samples an op gets, which samples are outliers, and what a set of samples summarises
// to. Host code only, no CUDA header: the backends produce samples (microseconds per run)
// and hand them here, so that the cpu and the cuda profile are summarised by the same math,
// tested on any machine (tests/profiler/sampling_test.cc).
//
// Percentiles interpolate linearly between order statistics (Hyndman and Fan type 7,
// numpy's default): the q quantile of sorted x[0..n-1] is at position q (n - 1). Worked
// example, samples {4, 1, 3, 2} sorted to {1, 2, 3, 4}:
//     median  position 1.5  2 + 0.5 (3 - 2) = 2.5
//     p10     position 0.3  1 + 0.3 (2 - 1) = 1.3
//     p90     position 2.7  3 + 0.7 (4 - 3) = 3.7
//
// Sampling (the cuda backend): `warmup` untimed runs, then batches of samples until the
// median is known to within ±target_relative_ci (95 % confidence) or `max_samples` is
// reached, never fewer than `min_samples`. The confidence interval of the median is
// distribution-free: with n sorted samples x(1) <= ... <= x(n), [x(r), x(s)] with
// r = floor((n - z sqrt(n)) / 2) and s = ceil(1 + (n + z sqrt(n)) / 2), z = 1.96, clamped to
// [1, n] (the normal approximation of the binomial order-statistic interval; Conover,
// "Practical Nonparametric Statistics", section 3.2). For n = 100: [x(40), x(61)].
//
// Outliers: a sample further than kOutlierMads scaled MADs from the median (MAD scaled by
// 1.4826 to estimate a normal standard deviation), with the MAD floored at 1 % of the
// median so that a run of identical samples does not turn every other value into an
// outlier. Outliers (a preempted host thread, an NCCL proxy hiccup) are counted and left out
// of the summary; the median hardly moves, but min, max, p10 and p90 would.

#include <cstdint>
#include <string>
#include <vector>

#include "lib/profile.h"

namespace dhelix::sampling {

/// Scaled MADs beyond which a sample is an outlier.
inline constexpr double kOutlierMads = 5.0;
/// Normal quantile of the two-sided 95 % confidence interval.
inline constexpr double kZ95 = 1.959964;

/// The `q` quantile (0 <= q <= 1) of `sorted` (ascending, non-empty; DHELIX_CHECKed), see
/// the file comment.
double quantile(const std::vector<double>& sorted, double q);

/// The median of `values` (non-empty, unsorted).
double median(std::vector<double> values);

/// Median, p10, p90, min and max of `samples_us` (non-empty, unsorted), with no outlier
/// removal and no rounding.
TimeStats summarize(std::vector<double> samples_us);

/// How many runs an op (or a pair) gets. Invariants (check_sampling_policy): warmup >= 0,
/// 1 <= min_samples <= max_samples, batch >= 1, target_relative_ci > 0.
struct SamplingPolicy {
  int64_t warmup = 3;                ///< untimed runs first
  int64_t min_samples = 15;          ///< timed runs always taken
  int64_t max_samples = 200;         ///< timed runs at most
  int64_t batch = 10;                ///< timed runs added per round after min_samples
  double target_relative_ci = 0.01;  ///< CI half-width / median to stop at (1 %)
};

/// DHELIX_CHECKs the SamplingPolicy invariants.
void check_sampling_policy(const SamplingPolicy& policy);

/// 95 % confidence interval of the median, as values of `sorted` (ascending, non-empty).
struct MedianInterval {
  double low = 0, high = 0;
};
MedianInterval median_confidence_interval(const std::vector<double>& sorted);

/// Half the width of the median's confidence interval over the median; 0 when the median
/// is 0 (nothing to refine). `samples` need not be sorted; non-empty.
double relative_ci_half_width(std::vector<double> samples);

/// Timed runs to add after `samples` (one value per run): 0 when the policy is satisfied,
/// else min_samples - n below the minimum, else min(batch, max_samples - n).
int64_t samples_to_add(const std::vector<double>& samples, const SamplingPolicy& policy);

/// Samples within kOutlierMads scaled MADs of the median, in input order, and how many were
/// left out (see the file comment). Non-empty input gives non-empty `kept`: the median is
/// always within its own distance.
struct OutlierSplit {
  std::vector<double> kept;
  int64_t outliers = 0;
};
OutlierSplit remove_outliers(const std::vector<double>& samples);

/// Spread of one value over the ranks that measured it (each rank's own median).
struct RankSpread {
  double min_us = 0, median_us = 0, max_us = 0;
  int64_t slowest_rank = 0;  ///< the rank with max_us (the lowest such rank)
};
/// `per_rank_us[r]` is rank r's value; non-empty.
RankSpread rank_spread(const std::vector<double>& per_rank_us);

/// One run of two ops started together: when each finished, in us from the start.
struct PairSample {
  double finish_a_us = 0;
  double finish_b_us = 0;
};

/// How a pair's measured finish times were fitted into what a profile can hold.
enum class PairAdjustment {
  kNone,
  kRaisedToSolo,         ///< a finish time below the op's solo median (noise) was raised to it
  kCappedAtOefMinusOne,  ///< makespan beyond T_max + 2 T_min (OEF < -1) was capped there
};

/// The profile entry of pair (a, b) from its samples and the ops. solo medians (>= 0):
/// finish times are the samples' medians, each raised to at least its op's solo median;
/// a makespan beyond max(T) + 2 min(T) (an OEF below -1, which profiles cannot hold) is
/// capped there. Values are quantized (quantize_profile_value) and the OEF follows from
/// the quantized numbers, as the profile reader checks. `adjustment` (may be null) says
/// which correction applied (capping wins when both did).
ProfiledPair pair_from_samples(const std::string& a, const std::string& b, double solo_a_us,
                               double solo_b_us, const std::vector<PairSample>& samples,
                               PairAdjustment* adjustment);

}  // namespace dhelix::sampling
