// The shared expert's gate row functions (runtime/kernels/moe_shared_gate.h) on
// hand-computed values, the one summation order of the backward's dot product, and the
// CPU shared expert's arithmetic before these functions existed (bit for bit).
#include "runtime/kernels/moe_shared_gate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace dhelix::kernels {
namespace {

TEST(MoeSharedGate, ForwardOnHandValues) {
  EXPECT_EQ(shared_gate(0.0f), 0.5f);
  EXPECT_EQ(shared_gate(200.0f), 1.0f);  // exact at the float limits (swiglu.h's sigmoid)
  EXPECT_EQ(shared_gate(-200.0f), 0.0f);
  EXPECT_FLOAT_EQ(shared_gate(std::log(3.0f)), 0.75f);  // 1 / (1 + 1/3)
  // The header's worked example: g = 0.5, out = (2, -4), y = (1, 1) -> (2, -1).
  const std::vector<float> out = {2.0f, -4.0f};
  std::vector<float> y = {1.0f, 1.0f};
  shared_gate_add_row(2, shared_gate(0.0f), out.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{2.0f, -1.0f}));
  EXPECT_EQ(shared_gate_add(1.0f, 0.25f, 8.0f), 3.0f);
}

TEST(MoeSharedGate, BackwardOnHandValues) {
  // g = 0.5, dy = (1, 1), out = (2, -4): <dy, out> = -2, d_logit = -2 * 0.5 * 0.5 = -0.5,
  // d_out = (0.5, 0.5).
  const std::vector<float> dy = {1.0f, 1.0f}, out = {2.0f, -4.0f};
  std::vector<float> d_out(2);
  EXPECT_EQ(shared_gate_backward_row(2, 0.5f, dy.data(), out.data(), d_out.data()), -0.5f);
  EXPECT_EQ(d_out, (std::vector<float>{0.5f, 0.5f}));
  // The worked example's dy = (1, 0.5): <dy, out> = 0.
  const std::vector<float> dy2 = {1.0f, 0.5f};
  EXPECT_EQ(shared_gate_backward_row(2, 0.5f, dy2.data(), out.data(), d_out.data()), 0.0f);
  EXPECT_EQ(d_out, (std::vector<float>{0.5f, 0.25f}));
  // g = 0.75: d_logit = <dy, out> * 0.75 * 0.25 = 4 * 0.1875.
  const std::vector<float> dy3 = {2.0f, 0.0f};
  EXPECT_EQ(shared_gate_backward_row(2, 0.75f, dy3.data(), out.data(), d_out.data()), 0.75f);
  EXPECT_EQ(d_out, (std::vector<float>{1.5f, 0.0f}));
  EXPECT_EQ(shared_gate_scale(0.75f, -4.0f), -3.0f);
}

TEST(MoeSharedGate, TheDotProductIsSummedLeftToRight) {
  // 1e8 + 1 rounds back to 1e8 in fp32: out = (1e8, 1, -1e8) sums to 0 left to right and to
  // 1 in any order that adds the 1 last, as out = (1e8, -1e8, 1) does left to right. The
  // GPU's one thread per row sums in this order too.
  const std::vector<float> dy = {1.0f, 1.0f, 1.0f};
  const std::vector<float> one_in_the_middle = {1e8f, 1.0f, -1e8f};
  const std::vector<float> one_last = {1e8f, -1e8f, 1.0f};
  std::vector<float> d_out(3);
  EXPECT_EQ(shared_gate_backward_row(3, 0.5f, dy.data(), one_in_the_middle.data(), d_out.data()),
            0.0f);
  EXPECT_EQ(shared_gate_backward_row(3, 0.5f, dy.data(), one_last.data(), d_out.data()), 0.25f);
  // The accessor form (the GPU's) is the same sum.
  EXPECT_EQ(shared_gate_dlogit(
                3, 0.5f, [&](int64_t i) { return dy[static_cast<size_t>(i)]; },
                [&](int64_t i) { return one_in_the_middle[static_cast<size_t>(i)]; }),
            0.0f);
}

// What moe_shared_expert_cpu.cc computed inline before it called these functions.
TEST(MoeSharedGate, EqualsTheCpuSharedExpertsFormerArithmeticBitForBit) {
  std::mt19937 generator(5);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  const int64_t h = 67;
  std::vector<float> dy(h), out(h), y(h);
  for (int64_t i = 0; i < h; ++i) {
    dy[static_cast<size_t>(i)] = uniform(generator);
    out[static_cast<size_t>(i)] = uniform(generator);
    y[static_cast<size_t>(i)] = uniform(generator);
  }
  const float logit = uniform(generator);
  const float g = 1.0f / (1.0f + std::exp(-logit));
  EXPECT_EQ(shared_gate(logit), g);
  float dg = 0.0f;
  std::vector<float> want_d_out(h), want_y = y;
  for (int64_t i = 0; i < h; ++i) {
    const size_t k = static_cast<size_t>(i);
    dg += dy[k] * out[k];
    want_d_out[k] = g * dy[k];
    want_y[k] += g * out[k];
  }
  std::vector<float> d_out(h);
  EXPECT_EQ(shared_gate_backward_row(h, g, dy.data(), out.data(), d_out.data()),
            dg * g * (1.0f - g));
  EXPECT_EQ(d_out, want_d_out);
  shared_gate_add_row(h, g, out.data(), y.data());
  EXPECT_EQ(y, want_y);
}

}  // namespace
}  // namespace dhelix::kernels
