#include "planner/dp_overlap.h"

#include <gtest/gtest.h>

namespace dhelix {
namespace {

TEST(DpOverlap, BucketsFollowMegatronCoresDefaultSize) {
  // max(40M, 1M * dp) parameters a bucket.
  EXPECT_EQ(megatron_dp_bucket_parameters(8), 40'000'000);
  EXPECT_EQ(megatron_dp_bucket_parameters(64), 64'000'000);
  EXPECT_EQ(megatron_dp_buckets(100'000'000, 8), 3);  // ceil(100 / 40)
  EXPECT_EQ(megatron_dp_buckets(1, 8), 1);
}

TEST(DpOverlap, WorkedExampleOfTheHeader) {
  // reduce 12 ms, gather 6 ms, 4 buckets, backward 10 ms, forward 5 ms:
  // exposed max(3, 2) + max(1.5, 1) = 4.5 ms; hidden 18 - 4.5 = 13.5 ms.
  const DpOverlap o = overlap_dp(12'000, 6'000, 4, 10'000, 5'000, true, true);
  EXPECT_DOUBLE_EQ(o.exposed_us, 4'500);
  EXPECT_DOUBLE_EQ(o.hidden_us, 13'500);
  EXPECT_DOUBLE_EQ(o.reduce_exposed_us, 3'000);
  EXPECT_DOUBLE_EQ(o.gather_exposed_us, 1'500);
}

TEST(DpOverlap, ATooShortWindowExposesTheRest) {
  // reduce 12 ms in 4 buckets under a 2 ms backward: max(3, 10) = 10 ms exposed.
  const DpOverlap o = overlap_dp(12'000, 0, 4, 2'000, 0, true, true);
  EXPECT_DOUBLE_EQ(o.exposed_us, 10'000);
  EXPECT_DOUBLE_EQ(o.hidden_us, 2'000);
}

TEST(DpOverlap, SwitchedOffExposesEverything) {
  const DpOverlap off = overlap_dp(12'000, 6'000, 4, 10'000, 5'000, false, false);
  EXPECT_DOUBLE_EQ(off.exposed_us, 18'000);
  EXPECT_DOUBLE_EQ(off.hidden_us, 0);
  const DpOverlap reduce_only = overlap_dp(12'000, 6'000, 4, 10'000, 5'000, true, false);
  EXPECT_DOUBLE_EQ(reduce_only.exposed_us, 3'000 + 6'000);
}

}  // namespace
}  // namespace dhelix
