#include "runtime/cuda/cublas_gemm.h"

#include <fmt/format.h>

#include <limits>

#include "lib/error.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/device_setup.h"

namespace dhelix::cuda {
namespace {

void check_argument(bool ok, const char* name, int64_t value, const std::string& rule) {
  if (!ok) {
    throw Error(ErrorCode::kInvalidInput, fmt::format("GEMM: {} = {} {}", name, value, rule));
  }
}

int as_int(int64_t value) { return static_cast<int>(value); }

}  // namespace

ColumnMajorGemm map_row_major_gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n,
                                   int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  check_argument(m >= 0 && m <= kMax, "m", m, "is outside [0, 2^31)");
  check_argument(n >= 0 && n <= kMax, "n", n, "is outside [0, 2^31)");
  check_argument(k >= 0 && k <= kMax, "k", k, "is outside [0, 2^31)");
  const int64_t a_row = transpose_a ? m : k;
  const int64_t b_row = transpose_b ? k : n;
  check_argument(lda >= std::max<int64_t>(1, a_row) && lda <= kMax, "lda", lda,
                 fmt::format("is shorter than a stored row of A ({})", a_row));
  check_argument(ldb >= std::max<int64_t>(1, b_row) && ldb <= kMax, "ldb", ldb,
                 fmt::format("is shorter than a stored row of B ({})", b_row));
  check_argument(ldc >= std::max<int64_t>(1, n) && ldc <= kMax, "ldc", ldc,
                 fmt::format("is shorter than a row of C ({})", n));
  ColumnMajorGemm args;
  args.transpose_first = transpose_b;
  args.transpose_second = transpose_a;
  args.m = n;
  args.n = m;
  args.k = k;
  args.ld_first = ldb;
  args.ld_second = lda;
  args.ld_c = ldc;
  return args;
}

void configure_gemm_handle(cublasHandle_t handle, void* workspace, int64_t bytes) {
  // No TF32 or other reduced-precision shortcuts beyond the bf16 inputs themselves.
  DHELIX_CUBLAS(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
  if (bytes > 0) {
    DHELIX_CUBLAS(cublasSetWorkspace(handle, workspace, static_cast<size_t>(bytes)));
  }
}

void enqueue_gemm(cublasHandle_t handle, const GemmShape& shape, const __nv_bfloat16* a,
                  const __nv_bfloat16* b, void* c) {
  // Packed operands as stored: A [m, k] ([k, m] transposed), B [k, n] ([n, k]), C [m, n].
  const ColumnMajorGemm args = map_row_major_gemm(
      shape.transpose_a, shape.transpose_b, shape.m, shape.n, shape.k,
      shape.transpose_a ? shape.m : shape.k, shape.transpose_b ? shape.k : shape.n, shape.n);
  if (args.m == 0 || args.n == 0) return;
  const float alpha = 1.0f;
  const float beta = shape.accumulate ? 1.0f : 0.0f;
  DHELIX_CUBLAS(cublasGemmEx(handle, args.transpose_first ? CUBLAS_OP_T : CUBLAS_OP_N,
                             args.transpose_second ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(args.m),
                             as_int(args.n), as_int(args.k), &alpha, b, CUDA_R_16BF,
                             as_int(args.ld_first), a, CUDA_R_16BF, as_int(args.ld_second), &beta,
                             c, shape.fp32_output ? CUDA_R_32F : CUDA_R_16BF, as_int(args.ld_c),
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

CublasGemm::CublasGemm(cudaStream_t stream, int64_t workspace_bytes) : stream_(stream) {
  DHELIX_CUBLAS(cublasCreate(&handle_));
  try {
    DHELIX_CUBLAS(cublasSetStream(handle_, stream_));
    if (workspace_bytes > 0) {
      DHELIX_CUDA(cudaMalloc(&workspace_, static_cast<size_t>(workspace_bytes)));
    }
    configure_gemm_handle(handle_, workspace_, workspace_bytes);
  } catch (...) {
    if (workspace_ != nullptr) static_cast<void>(cudaFree(workspace_));
    static_cast<void>(cublasDestroy(handle_));
    throw;
  }
}

CublasGemm::~CublasGemm() {
  static_cast<void>(cublasDestroy(handle_));
  if (workspace_ != nullptr) static_cast<void>(cudaFree(workspace_));
}

void CublasGemm::gemm_ex(const ColumnMajorGemm& args, float alpha, const void* a, const void* b,
                         float beta, void* c, cudaDataType_t c_type) {
  if (args.m == 0 || args.n == 0) return;
  DHELIX_CUBLAS(cublasGemmEx(handle_, args.transpose_first ? CUBLAS_OP_T : CUBLAS_OP_N,
                             args.transpose_second ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(args.m),
                             as_int(args.n), as_int(args.k), &alpha, b, CUDA_R_16BF,
                             as_int(args.ld_first), a, CUDA_R_16BF, as_int(args.ld_second), &beta,
                             c, c_type, as_int(args.ld_c), CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT));
}

void CublasGemm::gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b,
                      int64_t ldb, float beta, __nv_bfloat16* c, int64_t ldc) {
  gemm_ex(map_row_major_gemm(transpose_a, transpose_b, m, n, k, lda, ldb, ldc), alpha, a, b, beta,
          c, CUDA_R_16BF);
}

void CublasGemm::gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b,
                      int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_ex(map_row_major_gemm(transpose_a, transpose_b, m, n, k, lda, ldb, ldc), alpha, a, b, beta,
          c, CUDA_R_32F);
}

void CublasGemm::run(const GemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* b,
                     void* c) {
  enqueue_gemm(handle_, shape, a, b, c);
}

void CublasGemm::linear_forward(int64_t rows, int64_t in, int64_t out, const __nv_bfloat16* x,
                                const __nv_bfloat16* w, __nv_bfloat16* y) {
  run(linear_forward_shape(rows, in, out), x, w, y);
}

void CublasGemm::linear_dgrad(int64_t rows, int64_t in, int64_t out, const __nv_bfloat16* dy,
                              const __nv_bfloat16* w, __nv_bfloat16* dx) {
  run(linear_dgrad_shape(rows, in, out), dy, w, dx);
}

void CublasGemm::linear_wgrad_accumulate(int64_t rows, int64_t in, int64_t out,
                                         const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                         float* dw) {
  run(linear_wgrad_shape(rows, in, out), dy, x, dw);
}

}  // namespace dhelix::cuda
