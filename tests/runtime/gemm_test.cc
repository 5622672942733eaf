// GEMM through OpenBLAS against the naive double-accumulating reference, the linear-layer
// wrappers' layouts, and bitwise repeatability at a fixed thread count.

#include <algorithm>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/cpu/kernels_cpu.h"
#include "tests/runtime/kernel_test_util.h"

namespace dhelix::cpu {
namespace {

using test::bitwise_equal;
using test::random_floats;

// fp32 sums of k <= 64 products of terms in [-1, 1] stay within ~k * 6e-8 of the truth.
void expect_close(const std::vector<float>& actual, const std::vector<float>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-5 * std::max(1.0f, std::abs(expected[i])))
        << "element " << i;
  }
}

TEST(GemmReference, MultipliesATwoByTwoByHand) {
  // [1 2; 3 4] * [5 6; 7 8] = [19 22; 43 50]; then 2 * that + 1 * [1 1; 1 1].
  std::vector<float> a = {1, 2, 3, 4}, b = {5, 6, 7, 8}, c = {1, 1, 1, 1};
  gemm_reference(false, false, 2, 2, 2, 2.0f, a.data(), 2, b.data(), 2, 1.0f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{39, 45, 87, 101}));
  // A^T B with A^T = [1 3; 2 4]: [26 30; 38 44]; beta = 0 ignores the NaN in C.
  std::vector<float> d = {NAN, NAN, NAN, NAN};
  gemm_reference(true, false, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, d.data(), 2);
  EXPECT_EQ(d, (std::vector<float>{26, 30, 38, 44}));
}

TEST(Gemm, MatchesReferenceForEveryTransposeAndOddSizes) {
  set_blas_threads(1);
  const int64_t m = 37, n = 23, k = 19;
  for (bool transpose_a : {false, true}) {
    for (bool transpose_b : {false, true}) {
      std::vector<float> a = random_floats(m * k, 1), b = random_floats(k * n, 2);
      std::vector<float> c = random_floats(m * n, 3);
      std::vector<float> expected = c;
      int64_t lda = transpose_a ? m : k, ldb = transpose_b ? k : n;
      gemm(transpose_a, transpose_b, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, c.data(),
           n);
      gemm_reference(transpose_a, transpose_b, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 1.0f,
                     expected.data(), n);
      SCOPED_TRACE(::testing::Message()
                   << "transpose_a=" << transpose_a << " transpose_b=" << transpose_b);
      expect_close(c, expected);
    }
  }
}

TEST(Gemm, LinearLayerForwardDgradAndAccumulatingWgrad) {
  set_blas_threads(1);
  const int64_t rows = 13, in = 24, out = 10;
  std::vector<float> x = random_floats(rows * in, 4), w = random_floats(out * in, 5);
  std::vector<float> dy = random_floats(rows * out, 6);

  std::vector<float> y(rows * out), y_expected(rows * out);
  linear_forward(rows, in, out, x.data(), w.data(), y.data());
  gemm_reference(false, true, rows, out, in, 1.0f, x.data(), in, w.data(), in, 0.0f,
                 y_expected.data(), out);
  expect_close(y, y_expected);
  // Spot check of the layout: y[2][3] = sum_i x[2][i] * w[3][i].
  double y23 = 0.0;
  for (int64_t i = 0; i < in; ++i) y23 += static_cast<double>(x[2 * in + i]) * w[3 * in + i];
  EXPECT_NEAR(y[2 * out + 3], y23, 1e-5);

  std::vector<float> dx(rows * in), dx_expected(rows * in);
  linear_dgrad(rows, in, out, dy.data(), w.data(), dx.data());
  gemm_reference(false, false, rows, in, out, 1.0f, dy.data(), out, w.data(), in, 0.0f,
                 dx_expected.data(), in);
  expect_close(dx, dx_expected);

  // wgrad accumulates: starting from 1 everywhere, dw = 1 + dy^T x.
  std::vector<float> dw(out * in, 1.0f), dw_expected(out * in, 1.0f);
  linear_wgrad_accumulate(rows, in, out, dy.data(), x.data(), dw.data());
  gemm_reference(true, false, out, in, rows, 1.0f, dy.data(), out, x.data(), in, 1.0f,
                 dw_expected.data(), in);
  expect_close(dw, dw_expected);
  double dw00 = 1.0;
  for (int64_t r = 0; r < rows; ++r) dw00 += static_cast<double>(dy[r * out]) * x[r * in];
  EXPECT_NEAR(dw[0], dw00, 1e-5);
}

TEST(Gemm, RepeatsBitwiseAtAFixedThreadCount) {
  set_blas_threads(1);
  const int64_t m = 192, n = 160, k = 256;
  std::vector<float> a = random_floats(m * k, 7), b = random_floats(n * k, 8);
  std::vector<float> first(m * n), second(m * n);
  gemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, first.data(), n);
  gemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, second.data(), n);
  EXPECT_TRUE(bitwise_equal(first, second));
}

}  // namespace
}  // namespace dhelix::cpu
