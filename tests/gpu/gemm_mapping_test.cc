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

// The shared expert's gate (runtime/model/moe_shared_expert_padded.h): the three linear
// GEMMs with out = 1 (h = 64 -> 1 on 32 rows), as CublasGemm's linear_* call them, map to
// cuBLAS arguments whose leading dimensions cuBLAS accepts (ld >= rows of the column-major
// operand as stored: first [m or k], second [k or n], C [m]).
TEST(GemmMapping, TheGatesOutputWidthOfOneMapsToValidLeadingDimensions) {
  const int64_t rows = 32, in = 64, out = 1;
  const ColumnMajorGemm forward = map_row_major_gemm(false, true, rows, out, in, in, in, out);
  EXPECT_EQ(forward.m, 1);
  EXPECT_EQ(forward.n, rows);
  EXPECT_EQ(forward.ld_first, in);  // W^T stored [in, 1]: ld >= k
  EXPECT_EQ(forward.ld_c, 1);       // y [1, rows] column-major: ld >= m = 1
  const ColumnMajorGemm dgrad = map_row_major_gemm(false, false, rows, in, out, out, in, in);
  EXPECT_EQ(dgrad.m, in);
  EXPECT_EQ(dgrad.k, 1);
  EXPECT_EQ(dgrad.ld_first, in);  // W [in, 1]: ld >= m
  EXPECT_EQ(dgrad.ld_second, 1);  // dy [1, rows]: ld >= k = 1
  const ColumnMajorGemm wgrad = map_row_major_gemm(true, false, out, in, rows, out, in, in);
  EXPECT_TRUE(wgrad.transpose_second);
  EXPECT_EQ(wgrad.m, in);
  EXPECT_EQ(wgrad.n, 1);
  EXPECT_EQ(wgrad.k, rows);
  EXPECT_EQ(wgrad.ld_second, 1);  // dy stored [1, rows], read transposed: ld >= n = 1
  EXPECT_EQ(wgrad.ld_c, in);
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
