// The gradient finiteness test shared by the CPU engine and the CUDA kernel
// (runtime/kernels/finite_check.h).
#include "runtime/kernels/finite_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace dhelix::kernels {
namespace {

TEST(FiniteCheck, ExponentAllOnesIsNotFinite) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f, -0.0f, 1.0f, -3.0e38f, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::lowest(), std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min()}) {
    EXPECT_TRUE(is_finite_value(v)) << v;
    EXPECT_EQ(is_finite_value(v), static_cast<bool>(std::isfinite(v)));
  }
  for (float v :
       {kInf, -kInf, std::numeric_limits<float>::quiet_NaN(),
        -std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::signaling_NaN()}) {
    EXPECT_FALSE(is_finite_value(v)) << v;
  }
}

TEST(FiniteCheck, CountsEveryBadElement) {
  std::vector<float> values(1000, 0.25f);
  EXPECT_EQ(count_non_finite(values.data(), 1000), 0);
  EXPECT_EQ(count_non_finite(values.data(), 0), 0);
  values[0] = std::numeric_limits<float>::infinity();
  values[999] = std::nanf("");
  values[500] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(count_non_finite(values.data(), 1000), 3);
  EXPECT_EQ(count_non_finite(values.data() + 1, 998), 1);
}

}  // namespace
}  // namespace dhelix::kernels
