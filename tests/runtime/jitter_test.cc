// --jitter-us delays (runtime/exec/jitter.h): the same on both backends, repeatable.

#include "runtime/exec/jitter.h"

#include <gtest/gtest.h>

#include <set>

namespace dhelix::rt {
namespace {

TEST(Jitter, NoneWithoutAMaximum) {
  EXPECT_EQ(jitter_us_for(7, 3, 0), 0);
  EXPECT_EQ(jitter_us_for(7, 3, -5), 0);
}

TEST(Jitter, DelaysSpreadOverTheRangeAndRepeat) {
  std::set<int64_t> seen;
  for (uint64_t index = 0; index < 2000; ++index) {
    const int64_t delay = jitter_us_for(42, index, 9);
    ASSERT_GE(delay, 0);
    ASSERT_LE(delay, 9);
    EXPECT_EQ(delay, jitter_us_for(42, index, 9));  // a fixed sequence
    seen.insert(delay);
  }
  EXPECT_EQ(seen.size(), 10u);  // every value 0..9 occurs
}

TEST(Jitter, SeedsGiveDifferentSequences) {
  int differ = 0;
  for (uint64_t index = 0; index < 100; ++index) {
    if (jitter_us_for(1, index, 1000) != jitter_us_for(2, index, 1000)) ++differ;
  }
  EXPECT_GT(differ, 90);
  // splitmix64 of seed 0, index 0 (z = golden ratio constant): a pinned value, so that a
  // change of the generator, which would change every recorded --jitter-us run, is seen.
  EXPECT_EQ(jitter_us_for(0, 0, 1000000), static_cast<int64_t>(0xe220a8397b1dcdafULL % 1000001));
}

}  // namespace
}  // namespace dhelix::rt
