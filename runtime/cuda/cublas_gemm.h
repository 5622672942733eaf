#pragma once
// GEMMs of the CUDA backend through cuBLAS: bf16 inputs, fp32 accumulation
// (cublasGemmEx with CUBLAS_COMPUTE_32F), with the CPU backend's linear-layer contracts
// (runtime/cpu/kernels_cpu.h: PyTorch's W[out, in], y = x W^T, dx = dy W, dW += dy^T x).
//
// Row-major onto column-major. dhelix stores matrices row-major; cuBLAS reads them
// column-major. A row-major [r, c] matrix with leading dimension ld is, byte for byte, the
// column-major [c, r] matrix with the same ld: its transpose. So the row-major product
//   C[m, n] = op(A)[m, k] op(B)[k, n]
// is computed as the column-major product of the transposes
//   C^T[n, m] = op(B)^T[n, k] op(A)^T[k, m]
// i.e. cuBLAS gets B first and A second, each with its own transpose flag unchanged, and
// the sizes (m, n) swapped: cublas(m' = n, n' = m, k' = k, first = B (ldb), second = A
// (lda), C (ldc)).
//
// Worked example, the forward of a linear layer: x[rows = 4, in = 3], W[out = 2, in = 3],
// y[4, 2] = x W^T, row-major, i.e. gemm(transpose_a = false, transpose_b = true, m = 4,
// n = 2, k = 3, lda = 3, ldb = 3, ldc = 2). cuBLAS sees W's bytes as the column-major
// [3, 2] matrix W^T and x's as the column-major [3, 4] matrix x^T; the call is
//   cublasGemmEx(CUBLAS_OP_T, CUBLAS_OP_N, m' = 2, n' = 4, k' = 3, W, ld 3, x, ld 3, y, ld 2)
// which computes (W^T)^T x^T = W x^T = (x W^T)^T = y^T column-major [2, 4]: exactly the
// bytes of row-major y[4, 2].
//
// Determinism: cuBLAS gives the same bits run to run for the same shapes, GPU and library
// provided each stream has its own workspace; a CublasGemm owns one handle, one stream and
// one workspace, so the runtime makes one per stream that runs GEMMs.

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda/device_api.h"

namespace dhelix::cuda {

/// The row-major GEMM C[m, n] = op(A) op(B) as one column-major cuBLAS call (see the file
/// comment): operands swapped, sizes swapped, transposes kept.
struct ColumnMajorGemm {
  bool transpose_first = false;   ///< cuBLAS transa: applies to the first operand (B)
  bool transpose_second = false;  ///< cuBLAS transb: applies to the second operand (A)
  int64_t m = 0;                  ///< rows of the column-major result (= n)
  int64_t n = 0;                  ///< columns of the column-major result (= m)
  int64_t k = 0;
  int64_t ld_first = 0;   ///< = ldb
  int64_t ld_second = 0;  ///< = lda
  int64_t ld_c = 0;       ///< = ldc
};

/// Maps the row-major contract of cpu::gemm (op(A) is [m, k], A is [k, m] when
/// transpose_a; op(B) is [k, n], B is [n, k] when transpose_b; leading dimensions of the
/// matrices as stored) to cuBLAS's arguments. Throws Error(kInvalidInput) naming the
/// argument when a size is negative or a leading dimension is shorter than its row (a
/// stored row of A has k elements, or m when transpose_a; of B, n or k; of C, n), or when a
/// size exceeds cuBLAS's int range.
ColumnMajorGemm map_row_major_gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n,
                                   int64_t k, int64_t lda, int64_t ldb, int64_t ldc);

/// cuBLAS's workspace per handle (cuBLAS's own recommendation for Hopper). The workspace
/// bounds the kernels cuBLAS's heuristics may pick, so the runtime's handles and
/// dhelix-profile's have the same.
inline constexpr int64_t kCublasWorkspaceBytes = int64_t{32} << 20;

/// The settings of every handle that runs dhelix's GEMMs: default math (no TF32 or other
/// shortcuts beyond the bf16 inputs) and `workspace` of `bytes` (none when 0).
void configure_gemm_handle(cublasHandle_t handle, void* workspace, int64_t bytes);

/// Enqueues the GEMM `shape` describes (device_api.h: packed operands, A and B bf16, C
/// fp32 when shape.fp32_output else bf16, alpha 1, beta 1 when shape.accumulate else 0) on
/// `handle`'s stream. The one place that turns a GemmShape into a cuBLAS call: the runtime
/// (CublasGemm), its set-up's warm-up and dhelix-profile all call it, so the profile times
/// the kernels training runs.
void enqueue_gemm(cublasHandle_t handle, const GemmShape& shape, const __nv_bfloat16* a,
                  const __nv_bfloat16* b, void* c);

/// One cuBLAS handle bound to one stream with its own workspace.
class CublasGemm {
 public:
  /// workspace_bytes of device memory for cuBLAS (configure_gemm_handle).
  explicit CublasGemm(cudaStream_t stream, int64_t workspace_bytes = kCublasWorkspaceBytes);
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  /// C = alpha op(A) op(B) + beta C, row-major as cpu::gemm; A and B bf16, C bf16.
  void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
            const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b, int64_t ldb, float beta,
            __nv_bfloat16* c, int64_t ldc);
  /// The same with an fp32 C (weight gradients accumulate in fp32).
  void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
            const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b, int64_t ldb, float beta,
            float* c, int64_t ldc);

  /// enqueue_gemm on this handle and stream.
  void run(const GemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* b, void* c);

  /// y[rows, out] = x[rows, in] W^T, W[out, in].
  void linear_forward(int64_t rows, int64_t in, int64_t out, const __nv_bfloat16* x,
                      const __nv_bfloat16* w, __nv_bfloat16* y);
  /// dx[rows, in] = dy[rows, out] W[out, in].
  void linear_dgrad(int64_t rows, int64_t in, int64_t out, const __nv_bfloat16* dy,
                    const __nv_bfloat16* w, __nv_bfloat16* dx);
  /// dW[out, in] (fp32) += dy^T x (beta = 1: micro-batches accumulate).
  void linear_wgrad_accumulate(int64_t rows, int64_t in, int64_t out, const __nv_bfloat16* dy,
                               const __nv_bfloat16* x, float* dw);

  cudaStream_t stream() const { return stream_; }

 private:
  void gemm_ex(const ColumnMajorGemm& args, float alpha, const void* a, const void* b, float beta,
               void* c, cudaDataType_t c_type);

  cudaStream_t stream_;
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

}  // namespace dhelix::cuda
