#include "runtime/train/verification.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace dhelix::rt {
namespace {

IterationSnapshot snapshot() {
  IterationSnapshot s;
  s.losses = {std::numeric_limits<float>::quiet_NaN(), 2.5f};
  s.names = {"layers.0.w_qkv", "head"};
  s.gradients = {{1.0f, 2.0f, 3.0f}, {0.5f}};
  return s;
}

TEST(Verification, EqualSnapshotsHaveNoDifference) {
  EXPECT_FALSE(first_difference(snapshot(), snapshot()).has_value());
}

TEST(Verification, NamesTheFirstDifferingGradientElement) {
  IterationSnapshot other = snapshot();
  other.gradients[0][2] = std::nextafter(3.0f, 4.0f);
  other.gradients[1][0] = 0.25f;  // later tensor: not the first difference
  EXPECT_EQ(first_difference(snapshot(), other).value(),
            "gradient of layers.0.w_qkv differs at element 2: 3 (0x40400000) vs 3.00000024 "
            "(0x40400001)");
}

TEST(Verification, ComparesBitsNotValues) {
  // -0 == +0 as values, but a schedule that turns one into the other changed something.
  IterationSnapshot a = snapshot();
  IterationSnapshot b = snapshot();
  b.gradients[1][0] = a.gradients[1][0] = 0.0f;
  b.gradients[1][0] = -0.0f;
  EXPECT_EQ(first_difference(a, b).value(),
            "gradient of head differs at element 0: 0 (0x00000000) vs -0 (0x80000000)");
}

TEST(Verification, LossesComeFirst) {
  IterationSnapshot other = snapshot();
  other.losses[1] = 2.75f;
  other.gradients[0][0] = 9.0f;
  EXPECT_EQ(first_difference(snapshot(), other).value(),
            "loss of micro-batch 1 differs: 2.5 (0x40200000) vs 2.75 (0x40300000)");
}

}  // namespace
}  // namespace dhelix::rt
