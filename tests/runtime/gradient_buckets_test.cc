#include "runtime/train/gradient_buckets.h"

#include <gtest/gtest.h>

#include "lib/error.h"

namespace dhelix::rt {
namespace {

TEST(GradientBuckets, TheFileCommentsExample) {
  const auto buckets = plan_gradient_buckets({3, 5, 2, 9}, 8);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].first, 0);
  EXPECT_EQ(buckets[0].count, 2);
  EXPECT_EQ(buckets[0].elements, 8);
  EXPECT_EQ(buckets[0].offsets, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(buckets[1].first, 2);
  EXPECT_EQ(buckets[1].elements, 2);
  EXPECT_EQ(buckets[2].first, 3);
  EXPECT_EQ(buckets[2].count, 1);
  EXPECT_EQ(buckets[2].elements, 9);  // alone, larger than the size
}

TEST(GradientBuckets, OneBucketWhenEverythingFitsAndOneEachWhenNothingDoes) {
  EXPECT_EQ(plan_gradient_buckets({4, 4, 4}, 40'000'000).size(), 1u);
  EXPECT_EQ(plan_gradient_buckets({4, 4, 4}, 1).size(), 3u);
  EXPECT_TRUE(plan_gradient_buckets({}, 8).empty());
}

TEST(GradientBuckets, RefusesANonPositiveSize) {
  try {
    plan_gradient_buckets({1}, 0);
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    EXPECT_STREQ(error.what(), "--ddp-bucket-size: 0 is not a positive number of elements");
  }
}

}  // namespace
}  // namespace dhelix::rt
