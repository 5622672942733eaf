#pragma once
// Helpers of the kernel tests: seeded inputs, bitwise comparison, and a central
// finite-difference gradient check.
//
// Tolerance analysis of check_gradient. The kernels compute in fp32; the probe loss
// L = sum_k w_k y_k is summed in double from the fp32 outputs. With inputs and weights of
// order 1 and h = 1e-2:
//  - rounding: each y_k carries a few ulp (~1e-7 relative) of error, so L(x +- h) carries
//    at most ~n * 1e-7 for n <= 300 outputs, i.e. <= 3e-5; divided by the step 2h = 2e-2
//    that is <= 1.5e-3 in the worst case and ~1e-4 typically (errors do not all align);
//  - truncation: the central difference is off by h^2 / 6 * f''' ~ 2e-5 for smooth f.
// Hence |analytic - numeric| <= 2e-3 + 1e-2 * |numeric|. A dropped or mis-signed term in
// a backward formula is off by O(0.1) or more and fails.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace dhelix::test {

/// n floats uniform in [low, high) from a fixed seed.
inline std::vector<float> random_floats(int64_t n, uint32_t seed, float low = -1.0f,
                                        float high = 1.0f) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& value : values) value = uniform(engine);
  return values;
}

/// True when the two vectors hold the same bits.
inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// sum_k weights[k] * values[k] in double: the scalar probe of a gradient check.
inline double weighted_sum(const std::vector<float>& weights, const std::vector<float>& values) {
  double sum = 0.0;
  for (size_t k = 0; k < values.size(); ++k) sum += static_cast<double>(weights[k]) * values[k];
  return sum;
}

/// Compares analytic[i] with the central difference of loss() in input[i], for every i.
/// input is perturbed in place and restored. The step is the one actually taken after
/// rounding to float, so the float rounding of x +- h does not enter the error.
inline void expect_gradient_matches(const char* what, std::vector<float>& input,
                                    const std::function<double()>& loss,
                                    const std::vector<float>& analytic, float h = 1e-2f,
                                    double abs_tol = 2e-3, double rel_tol = 1e-2) {
  ASSERT_EQ(input.size(), analytic.size()) << what;
  for (size_t i = 0; i < input.size(); ++i) {
    float original = input[i];
    input[i] = original + h;
    float plus = input[i];
    double loss_plus = loss();
    input[i] = original - h;
    float minus = input[i];
    double loss_minus = loss();
    input[i] = original;
    double numeric = (loss_plus - loss_minus) / (static_cast<double>(plus) - minus);
    double tolerance = abs_tol + rel_tol * std::abs(numeric);
    EXPECT_NEAR(analytic[i], numeric, tolerance) << what << " element " << i;
  }
}

}  // namespace dhelix::test
