// cuBLAS GEMMs (bf16 in, fp32 accumulate) against cpu::gemm on the same bf16-rounded inputs.
#include <gtest/gtest.h>

#include <vector>

#include "runtime/cpu/kernels_cpu.h"
#include "runtime/cuda/cublas_gemm.h"
#include "tests/gpu/gpu_test_util.h"

namespace dhelix::cuda {
namespace {

using testing::bf16_rounded;
using testing::DeviceBuffer;
using testing::expect_close;
using testing::random_floats;
using testing::to_bf16;
using testing::to_f32;

TEST(CublasGemm, LinearForwardDgradAndAccumulatingWgrad) {
  DHELIX_REQUIRE_GPUS(1);
  cpu::set_blas_threads(1);
  const int64_t rows = 33, in = 48, out = 20;
  const std::vector<float> x = bf16_rounded(random_floats(rows * in, 31));
  const std::vector<float> w = bf16_rounded(random_floats(out * in, 32));
  const std::vector<float> dy = bf16_rounded(random_floats(rows * out, 33));
  std::vector<float> y(rows * out), dx(rows * in), dw(out * in, 0.5f);
  cpu::linear_forward(rows, in, out, x.data(), w.data(), y.data());
  cpu::linear_dgrad(rows, in, out, dy.data(), w.data(), dx.data());
  cpu::linear_wgrad_accumulate(rows, in, out, dy.data(), x.data(), dw.data());

  CublasGemm gemm(nullptr);
  DeviceBuffer<__nv_bfloat16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_dy(to_bf16(dy)), d_y(rows * out),
      d_dx(rows * in);
  DeviceBuffer<float> d_dw(std::vector<float>(out * in, 0.5f));
  gemm.linear_forward(rows, in, out, d_x.get(), d_w.get(), d_y.get());
  gemm.linear_dgrad(rows, in, out, d_dy.get(), d_w.get(), d_dx.get());
  gemm.linear_wgrad_accumulate(rows, in, out, d_dy.get(), d_x.get(), d_dw.get());
  expect_close(to_f32(d_y.download()), y, 1e-3f, 1.0f / 128, "y");
  expect_close(to_f32(d_dx.download()), dx, 1e-3f, 1.0f / 128, "dx");
  expect_close(d_dw.download(), dw, 1e-4f, 1e-4f, "dw");  // fp32 output, beta = 1 kept the 0.5
}

TEST(CublasGemm, GeneralTransposedOperands) {
  DHELIX_REQUIRE_GPUS(1);
  const int64_t m = 7, n = 9, k = 5;
  const std::vector<float> a = bf16_rounded(random_floats(k * m, 34));  // A stored [k, m]
  const std::vector<float> b = bf16_rounded(random_floats(n * k, 35));  // B stored [n, k]
  std::vector<float> c(m * n, 0.0f);
  cpu::gemm_reference(true, true, m, n, k, 2.0f, a.data(), m, b.data(), k, 0.0f, c.data(), n);
  CublasGemm gemm(nullptr);
  DeviceBuffer<__nv_bfloat16> d_a(to_bf16(a)), d_b(to_bf16(b));
  DeviceBuffer<float> d_c(m * n);
  gemm.gemm(true, true, m, n, k, 2.0f, d_a.get(), m, d_b.get(), k, 0.0f, d_c.get(), n);
  expect_close(d_c.download(), c, 1e-5f, 1e-5f, "c");
}

}  // namespace
}  // namespace dhelix::cuda
