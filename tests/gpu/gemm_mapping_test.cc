#include <gtest/gtest.h>

#include "lib/error.h"
#include "runtime/cuda/cublas_gemm.h"

namespace dhelix::cuda {
namespace {

// The worked example of cublas_gemm.h: y[4, 2] = x[4, 3] W^T with W[2, 3].
TEST(GemmMapping, LinearForwardSwapsOperandsAndSizes) {
  const ColumnMajorGemm args = map_row_major_gemm(false, true, 4, 2, 3, 3, 3, 2);
  EXPECT_TRUE(args.transpose_first);    // W, CUBLAS_OP_T
  EXPECT_FALSE(args.transpose_second);  // x, CUBLAS_OP_N
  EXPECT_EQ(args.m, 2);
  EXPECT_EQ(args.n, 4);
  EXPECT_EQ(args.k, 3);
  EXPECT_EQ(args.ld_first, 3);
  EXPECT_EQ(args.ld_second, 3);
  EXPECT_EQ(args.ld_c, 2);
}

// dx[rows = 5, in = 3] = dy[5, out = 2] W[2, 3]: no transposes; cuBLAS gets W (ld 3) first.
TEST(GemmMapping, LinearDgradHasNoTransposes) {
  const ColumnMajorGemm args = map_row_major_gemm(false, false, 5, 3, 2, 2, 3, 3);
  EXPECT_FALSE(args.transpose_first);
  EXPECT_FALSE(args.transpose_second);
  EXPECT_EQ(args.m, 3);
  EXPECT_EQ(args.n, 5);
  EXPECT_EQ(args.k, 2);
  EXPECT_EQ(args.ld_first, 3);
  EXPECT_EQ(args.ld_second, 2);
  EXPECT_EQ(args.ld_c, 3);
}

// dW[out = 2, in = 3] += dy^T x with dy[rows = 5, 2], x[5, 3]: A transposed, so cuBLAS's
// second operand (dy) is CUBLAS_OP_T.
TEST(GemmMapping, LinearWgradTransposesTheSecondOperand) {
  const ColumnMajorGemm args = map_row_major_gemm(true, false, 2, 3, 5, 2, 3, 3);
  EXPECT_FALSE(args.transpose_first);
  EXPECT_TRUE(args.transpose_second);
  EXPECT_EQ(args.m, 3);
  EXPECT_EQ(args.n, 2);
  EXPECT_EQ(args.k, 5);
  EXPECT_EQ(args.ld_first, 3);
  EXPECT_EQ(args.ld_second, 2);
}

TEST(GemmMapping, RefusesShortLeadingDimensions) {
  try {
    map_row_major_gemm(false, true, 4, 2, 3, 2, 3, 2);
    FAIL() << "lda 2 < k 3 accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    EXPECT_STREQ(error.what(), "GEMM: lda = 2 is shorter than a stored row of A (3)");
  }
  try {
    map_row_major_gemm(false, false, 4, 2, 3, 3, 1, 2);
    FAIL() << "ldb 1 < n 2 accepted";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "GEMM: ldb = 1 is shorter than a stored row of B (2)");
  }
  EXPECT_THROW(map_row_major_gemm(false, false, 4, 2, 3, 3, 2, 1), Error);
  // Submatrices: a longer leading dimension is fine.
  EXPECT_EQ(map_row_major_gemm(false, false, 4, 2, 3, 8, 8, 8).ld_c, 8);
  try {
    map_row_major_gemm(false, false, int64_t{1} << 31, 2, 3, 3, 2, 2);
    FAIL() << "m = 2^31 accepted";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "GEMM: m = 2147483648 is outside [0, 2^31)");
  }
}

}  // namespace
}  // namespace dhelix::cuda
