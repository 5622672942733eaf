// The shared expert's gate kernels (runtime/cuda/moe_shared_cuda.h) against the row
// functions of runtime/kernels/moe_shared_gate.h on the CPU, on bf16-rounded inputs: the
// gate values within fp32 rounding (CUDA's expf), the bf16 outputs (y += g out, d_out =
// g dy, d_logit) within the bf16 tolerance of docs/kernels.md (rel 2^-7), a few rows large
// enough that the per-row dot product runs over many elements.
#include <gtest/gtest.h>

#include <vector>

#include "lib/error.h"
#include "runtime/cuda/moe_shared_cuda.h"
#include "runtime/kernels/moe_shared_gate.h"
#include "tests/gpu/gpu_test_util.h"

namespace dhelix::cuda {
namespace {

using testing::bf16_rounded;
using testing::DeviceBuffer;
using testing::expect_close;
using testing::random_floats;
using testing::to_bf16;
using testing::to_f32;

constexpr int64_t kRows = 37, kHidden = 96;
constexpr float kBf16 = 1.0f / 128.0f;

size_t to_size(int64_t n) { return static_cast<size_t>(n); }

TEST(CudaMoeSharedGate, ForwardMatchesTheRowFunctions) {
  DHELIX_REQUIRE_GPUS(1);
  const std::vector<float> logit = bf16_rounded(random_floats(kRows, 1, -4.0f, 4.0f));
  const std::vector<float> out = bf16_rounded(random_floats(kRows * kHidden, 2));
  const std::vector<float> y0 = bf16_rounded(random_floats(kRows * kHidden, 3));
  std::vector<float> gate(to_size(kRows)), y = y0;
  for (int64_t r = 0; r < kRows; ++r) {
    gate[to_size(r)] = kernels::shared_gate(logit[to_size(r)]);
    kernels::shared_gate_add_row(kHidden, gate[to_size(r)], out.data() + r * kHidden,
                                 y.data() + r * kHidden);
  }
  DeviceBuffer<bf16> d_logit(to_bf16(logit)), d_out(to_bf16(out)), d_y(to_bf16(y0));
  DeviceBuffer<float> d_gate(kRows);
  moe_shared_gate(kRows, d_logit.get(), d_gate.get(), nullptr);
  moe_shared_gate_add(kRows, kHidden, d_gate.get(), d_out.get(), d_y.get(), nullptr);
  expect_close(d_gate.download(), gate, 1e-7f, 1e-6f, "gate");
  expect_close(to_f32(d_y.download()), y, 1e-6f, kBf16, "y");
}

TEST(CudaMoeSharedGate, BackwardMatchesTheRowFunctions) {
  DHELIX_REQUIRE_GPUS(1);
  const std::vector<float> gate = random_floats(kRows, 4, 0.05f, 0.95f);
  const std::vector<float> dy = bf16_rounded(random_floats(kRows * kHidden, 5));
  const std::vector<float> out = bf16_rounded(random_floats(kRows * kHidden, 6));
  std::vector<float> d_logit(to_size(kRows)), d_out(to_size(kRows * kHidden));
  for (int64_t r = 0; r < kRows; ++r) {
    d_logit[to_size(r)] =
        kernels::shared_gate_backward_row(kHidden, gate[to_size(r)], dy.data() + r * kHidden,
                                          out.data() + r * kHidden, d_out.data() + r * kHidden);
  }
  DeviceBuffer<float> g(gate);
  DeviceBuffer<bf16> g_dy(to_bf16(dy)), g_out(to_bf16(out)), g_dlogit(kRows),
      g_dout(kRows * kHidden), g_scaled(kRows * kHidden);
  moe_shared_gate_backward(kRows, kHidden, g.get(), g_dy.get(), g_out.get(), g_dlogit.get(),
                           g_dout.get(), nullptr);
  moe_shared_gate_scale(kRows, kHidden, g.get(), g_dy.get(), g_scaled.get(), nullptr);
  // d_logit sums kHidden products: fp32 with FMAs, then one bf16 rounding.
  expect_close(to_f32(g_dlogit.download()), d_logit, 1e-4f, kBf16, "d_logit");
  expect_close(to_f32(g_dout.download()), d_out, 1e-6f, kBf16, "d_out");
  // The scaling alone (the tp = 1 fc2 wgrad's copy) writes the same bits as the backward's.
  const std::vector<float> scaled = to_f32(g_scaled.download());
  EXPECT_EQ(scaled, to_f32(g_dout.download()));
}

TEST(CudaMoeSharedGate, RunsTwiceToTheSameBits) {
  DHELIX_REQUIRE_GPUS(1);
  const std::vector<float> gate = random_floats(kRows, 7, 0.05f, 0.95f);
  DeviceBuffer<float> g(gate);
  DeviceBuffer<bf16> dy(to_bf16(random_floats(kRows * kHidden, 8))),
      out(to_bf16(random_floats(kRows * kHidden, 9))), a(kRows), b(kRows), d_out(kRows * kHidden);
  moe_shared_gate_backward(kRows, kHidden, g.get(), dy.get(), out.get(), a.get(), d_out.get(),
                           nullptr);
  moe_shared_gate_backward(kRows, kHidden, g.get(), dy.get(), out.get(), b.get(), d_out.get(),
                           nullptr);
  EXPECT_EQ(to_f32(a.download()), to_f32(b.download()));
}

}  // namespace
}  // namespace dhelix::cuda
