// profiler/sampling.h: the statistics both measuring backends share. Every expected value
// is worked out by hand in the comment beside it.

#include "profiler/sampling.h"

#include <gtest/gtest.h>

#include <vector>

namespace dhelix::sampling {
namespace {

std::vector<double> one_to(int n) {
  std::vector<double> values;
  for (int i = 1; i <= n; ++i) values.push_back(i);
  return values;
}

TEST(Sampling, QuantilesInterpolateBetweenOrderStatistics) {
  const std::vector<double> sorted = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(quantile(sorted, 0.5), 2.5);  // position 1.5: 2 + 0.5 x 1
  EXPECT_DOUBLE_EQ(quantile(sorted, 0.1), 1.3);  // position 0.3: 1 + 0.3 x 1
  EXPECT_DOUBLE_EQ(quantile(sorted, 0.9), 3.7);  // position 2.7: 3 + 0.7 x 1
  EXPECT_DOUBLE_EQ(quantile(sorted, 0.0), 1);
  EXPECT_DOUBLE_EQ(quantile(sorted, 1.0), 4);
  EXPECT_DOUBLE_EQ(quantile({7}, 0.9), 7);  // one sample: every quantile is it
}

TEST(Sampling, QuantilesOfUnevenGaps) {
  // {10, 20, 40, 80, 160}: n - 1 = 4.
  const std::vector<double> sorted = {10, 20, 40, 80, 160};
  EXPECT_DOUBLE_EQ(quantile(sorted, 0.5), 40);    // position 2 exactly
  EXPECT_DOUBLE_EQ(quantile(sorted, 0.25), 20);   // position 1 exactly
  EXPECT_DOUBLE_EQ(quantile(sorted, 0.1), 14);    // position 0.4: 10 + 0.4 x 10
  EXPECT_DOUBLE_EQ(quantile(sorted, 0.9), 128);   // position 3.6: 80 + 0.6 x 80
  EXPECT_DOUBLE_EQ(quantile(sorted, 0.6), 56);    // position 2.4: 40 + 0.4 x 40
  EXPECT_DOUBLE_EQ(quantile(sorted, 0.95), 144);  // position 3.8: 80 + 0.8 x 80
}

TEST(Sampling, MedianOfEvenAndOddCounts) {
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(median({5}), 5);
}

TEST(Sampling, SummarySortsTheSamples) {
  const TimeStats three = summarize({5, 1, 3});
  EXPECT_DOUBLE_EQ(three.median_us, 3);
  EXPECT_DOUBLE_EQ(three.p10_us, 1.4);  // position 0.2: 1 + 0.2 x (3 - 1)
  EXPECT_DOUBLE_EQ(three.p90_us, 4.6);  // position 1.8: 3 + 0.8 x (5 - 3)
  EXPECT_DOUBLE_EQ(three.min_us, 1);
  EXPECT_DOUBLE_EQ(three.max_us, 5);
  const TimeStats four = summarize({4, 1, 3, 2});
  EXPECT_DOUBLE_EQ(four.median_us, 2.5);
  EXPECT_DOUBLE_EQ(four.p10_us, 1.3);
  EXPECT_DOUBLE_EQ(four.p90_us, 3.7);
  EXPECT_DOUBLE_EQ(four.min_us, 1);
  EXPECT_DOUBLE_EQ(four.max_us, 4);
}

TEST(Sampling, MedianIntervalUsesOrderStatistics) {
  // n = 100: r = floor((100 - 19.6) / 2) = 40, s = ceil(1 + 119.6 / 2) = 61 (1-based).
  const MedianInterval hundred = median_confidence_interval(one_to(100));
  EXPECT_DOUBLE_EQ(hundred.low, 40);
  EXPECT_DOUBLE_EQ(hundred.high, 61);
  // n = 10: r = floor(1.90) = 1, s = ceil(9.10) = 10: the whole sample.
  const MedianInterval ten = median_confidence_interval(one_to(10));
  EXPECT_DOUBLE_EQ(ten.low, 1);
  EXPECT_DOUBLE_EQ(ten.high, 10);
  // n = 1: clamped to the one sample.
  const MedianInterval one = median_confidence_interval({7});
  EXPECT_DOUBLE_EQ(one.low, 7);
  EXPECT_DOUBLE_EQ(one.high, 7);
}

TEST(Sampling, RelativeHalfWidth) {
  // 1..100: median 50.5, interval [40, 61]: 21 / 101.
  EXPECT_DOUBLE_EQ(relative_ci_half_width(one_to(100)), 21.0 / 101.0);
  EXPECT_DOUBLE_EQ(relative_ci_half_width({0, 0, 0}), 0);
}

TEST(Sampling, SamplesToAddFollowsThePolicy) {
  const SamplingPolicy policy{
      .warmup = 2, .min_samples = 5, .max_samples = 12, .batch = 4, .target_relative_ci = 0.01};
  EXPECT_EQ(samples_to_add({}, policy), 5);
  EXPECT_EQ(samples_to_add({10, 10}, policy), 3);
  // Five equal samples: interval of width 0, done.
  EXPECT_EQ(samples_to_add({10, 10, 10, 10, 10}, policy), 0);
  // Spread 1..10: half width 4.5 / 5.5, more needed, one batch.
  EXPECT_EQ(samples_to_add(one_to(10), policy), 2);  // capped by max_samples - n = 2
  EXPECT_EQ(samples_to_add(one_to(6), policy), 4);
  EXPECT_EQ(samples_to_add(one_to(12), policy), 0);  // at the cap
}

TEST(Sampling, OutliersBeyondFiveScaledMads) {
  // Median 10, MAD 1 (scaled 1.4826): limit 7.413 from the median.
  const OutlierSplit split = remove_outliers({9, 10, 11, 10, 9, 11, 10, 10, 100, 17.5, 17.3});
  EXPECT_EQ(split.outliers, 2);  // 100 and 17.5; 17.3 is 7.3 away and stays
  EXPECT_EQ(split.kept, (std::vector<double>{9, 10, 11, 10, 9, 11, 10, 10, 17.3}));
}

TEST(Sampling, IdenticalSamplesKeepANearbyValue) {
  // MAD 0 is floored at 1 % of the median: limit 5 x 1.4826 x 1 = 7.413.
  const OutlierSplit split = remove_outliers({100, 100, 100, 100, 105, 108});
  EXPECT_EQ(split.outliers, 1);
  EXPECT_EQ(split.kept, (std::vector<double>{100, 100, 100, 100, 105}));
}

TEST(Sampling, RankSpread) {
  const RankSpread spread = rank_spread({10, 12, 11, 12});
  EXPECT_DOUBLE_EQ(spread.min_us, 10);
  EXPECT_DOUBLE_EQ(spread.median_us, 11.5);  // sorted {10, 11, 12, 12}: (11 + 12) / 2
  EXPECT_DOUBLE_EQ(spread.max_us, 12);
  EXPECT_EQ(spread.slowest_rank, 1);  // the lowest rank holding the maximum
}

}  // namespace
}  // namespace dhelix::sampling
