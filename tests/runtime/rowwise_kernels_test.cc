// Row and element kernels: RMSNorm, RoPE, SwiGLU, cross-entropy, embedding, AdamW, and the
// shared lane-tree reduction. Hand-computed values, finite-difference gradients and
// bitwise repeatability.

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/cpu/kernels_cpu.h"
#include "runtime/kernels/cross_entropy.h"
#include "runtime/kernels/embedding.h"
#include "runtime/kernels/rmsnorm.h"
#include "runtime/kernels/swiglu.h"
#include "tests/runtime/kernel_test_util.h"

namespace dhelix::cpu {
namespace {

using test::bitwise_equal;
using test::expect_gradient_matches;
using test::random_floats;
using test::weighted_sum;

TEST(LaneTreeSum, AddsStridedLanesThenAHalvingTree) {
  // Element 0 and element 32 share lane 0 and cancel before the ones are added; a left-to-
  // right float sum would absorb the 31 ones into 1e8 and return 0.
  std::vector<float> values(33, 1.0f);
  values[0] = 1e8f;
  values[32] = -1e8f;
  float sum = kernels::lane_tree_sum(33, [&](int64_t i) { return values[i]; });
  EXPECT_EQ(sum, 31.0f);
  EXPECT_EQ(kernels::lane_tree_sum(0, [](int64_t) { return 1.0f; }), 0.0f);
  EXPECT_EQ(kernels::lane_tree_sum(100, [](int64_t i) { return static_cast<float>(i); }), 4950.0f);
}

TEST(RmsNorm, ForwardByHand) {
  // mean(x^2) = 4, so r = 1/2 with eps = 0 and y = gain * x / 2.
  std::vector<float> x = {2, -2, 2, -2}, gain = {1, 2, 3, 4}, y(4), rstd(1);
  rmsnorm_forward(1, 4, x.data(), gain.data(), 0.0f, y.data(), rstd.data());
  EXPECT_EQ(rstd[0], 0.5f);
  EXPECT_EQ(y, (std::vector<float>{1, -2, 3, -4}));
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, dim = 24;
  std::vector<float> x = random_floats(rows * dim, 11), gain = random_floats(dim, 12, 0.5f, 1.5f);
  std::vector<float> probe = random_floats(rows * dim, 13);
  auto loss = [&] {
    std::vector<float> y(rows * dim), rstd(rows);
    rmsnorm_forward(rows, dim, x.data(), gain.data(), 1e-5f, y.data(), rstd.data());
    return weighted_sum(probe, y);
  };
  std::vector<float> y(rows * dim), rstd(rows), dx(rows * dim), dgain(dim, 0.0f);
  rmsnorm_forward(rows, dim, x.data(), gain.data(), 1e-5f, y.data(), rstd.data());
  rmsnorm_backward(rows, dim, x.data(), gain.data(), rstd.data(), probe.data(), dx.data(),
                   dgain.data());
  expect_gradient_matches("dx", x, loss, dx);
  expect_gradient_matches("dgain", gain, loss, dgain);

  // The column-per-thread form of the gain gradient gives the same bits.
  for (int64_t col = 0; col < dim; ++col) {
    float column =
        kernels::rmsnorm_dgain_column(rows, dim, col, x.data(), rstd.data(), probe.data(), 0.0f);
    EXPECT_EQ(column, dgain[col]) << "column " << col;
  }
}

TEST(Rope, PositionZeroIsIdentityAndPositionOneTurnsByOneRadian) {
  const int64_t head_dim = 8;
  RopeTable table = make_rope_table(2, head_dim, 10000.0);
  std::vector<float> x = {1, 0, 0, 0, 0, 0, 0, 0, /*position 1:*/ 1, 0, 0, 0, 0, 0, 0, 0};
  std::vector<float> original = x;
  rope_forward(table, 1, 2, 1, 0, x.data());
  for (int64_t i = 0; i < head_dim; ++i) EXPECT_EQ(x[i], original[i]);
  // Pair 0 has frequency base^0 = 1: (1, 0) -> (cos 1, sin 1), in slots 0 and 4.
  EXPECT_FLOAT_EQ(x[8], static_cast<float>(std::cos(1.0)));
  EXPECT_FLOAT_EQ(x[12], static_cast<float>(std::sin(1.0)));
  // Pair 1 at position 1 turns by 10000^(-2/8) = 0.1 rad.
  EXPECT_FLOAT_EQ(table.cos[head_dim / 2 + 1], static_cast<float>(std::cos(0.1)));
}

TEST(Rope, PreservesNormsAndBackwardIsTheInverse) {
  const int64_t batch = 2, seq = 5, heads = 3, head_dim = 16;
  RopeTable table = make_rope_table(64, head_dim, 10000.0);
  std::vector<float> x = random_floats(batch * seq * heads * head_dim, 21);
  std::vector<float> rotated = x;
  rope_forward(table, batch, seq, heads, 40, rotated.data());
  for (int64_t v = 0; v < batch * seq * heads; ++v) {
    double before = 0.0, after = 0.0;
    for (int64_t i = 0; i < head_dim; ++i) {
      before += static_cast<double>(x[v * head_dim + i]) * x[v * head_dim + i];
      after += static_cast<double>(rotated[v * head_dim + i]) * rotated[v * head_dim + i];
    }
    EXPECT_NEAR(std::sqrt(after), std::sqrt(before), 1e-6 * std::sqrt(before)) << "vector " << v;
  }
  EXPECT_FALSE(bitwise_equal(rotated, x));  // offset 40: every pair turns
  std::vector<float> restored = rotated;
  rope_backward(table, batch, seq, heads, 40, restored.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(restored[i], x[i], 1e-6) << "element " << i;
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  const int64_t seq = 3, heads = 2, head_dim = 8;
  RopeTable table = make_rope_table(seq, head_dim, 10000.0);
  std::vector<float> x = random_floats(seq * heads * head_dim, 22);
  std::vector<float> probe = random_floats(x.size(), 23);
  auto loss = [&] {
    std::vector<float> y = x;
    rope_forward(table, 1, seq, heads, 0, y.data());
    return weighted_sum(probe, y);
  };
  std::vector<float> dx = probe;
  rope_backward(table, 1, seq, heads, 0, dx.data());
  expect_gradient_matches("dx", x, loss, dx);
}

TEST(SwiGlu, ForwardByHandAndBackwardMatchesFiniteDifferences) {
  EXPECT_EQ(kernels::swiglu_forward(0.0f, 5.0f), 0.0f);
  EXPECT_FLOAT_EQ(kernels::swiglu_forward(1.0f, 2.0f), 1.4621171572600098f);  // 2 / (1 + e^-1)
  EXPECT_EQ(kernels::swiglu_forward(-200.0f, 1.0f), -0.0f);  // sigmoid underflows to 0

  const int64_t rows = 3, ffn = 10;
  std::vector<float> gate_up = random_floats(rows * 2 * ffn, 31, -3.0f, 3.0f);
  std::vector<float> probe = random_floats(rows * ffn, 32);
  auto loss = [&] {
    std::vector<float> out(rows * ffn);
    swiglu_forward(rows, ffn, gate_up.data(), out.data());
    return weighted_sum(probe, out);
  };
  std::vector<float> d_gate_up(rows * 2 * ffn);
  swiglu_backward(rows, ffn, gate_up.data(), probe.data(), d_gate_up.data());
  expect_gradient_matches("d_gate_up", gate_up, loss, d_gate_up);
}

TEST(CrossEntropy, ByHand) {
  // Row 0: uniform logits over 4 classes, loss = log 4.
  // Row 1: lse = log(e + e^2 + e^3) = 3.40760596, target 0 -> loss = 2.40760596;
  //        softmax = (0.09003057, 0.24472847, 0.66524096).
  // Row 2: ignored (target -1).
  std::vector<float> logits = {0, 0, 0, 0, /*row 1:*/ 1, 2, 3, 0, /*row 2:*/ 5, 5, 5, 5};
  // Row 1 uses only three classes; pad its fourth logit to -inf so it weighs nothing.
  logits[7] = -INFINITY;
  std::vector<int64_t> targets = {2, 0, -1};
  std::vector<float> loss(3), lse(3), dlogits(12);
  cross_entropy_forward(3, 4, logits.data(), targets.data(), loss.data(), lse.data());
  EXPECT_FLOAT_EQ(loss[0], std::log(4.0f));
  EXPECT_FLOAT_EQ(lse[1], 3.40760596f);
  EXPECT_FLOAT_EQ(loss[1], 2.40760596f);
  EXPECT_EQ(loss[2], 0.0f);

  cross_entropy_backward(3, 4, logits.data(), targets.data(), lse.data(), 0.5f, dlogits.data());
  EXPECT_FLOAT_EQ(dlogits[0], 0.125f);   // 0.5 * (1/4 - 0)
  EXPECT_FLOAT_EQ(dlogits[2], -0.375f);  // 0.5 * (1/4 - 1)
  EXPECT_FLOAT_EQ(dlogits[4], 0.5f * (0.09003057f - 1.0f));
  EXPECT_FLOAT_EQ(dlogits[5], 0.5f * 0.24472847f);
  EXPECT_FLOAT_EQ(dlogits[6], 0.5f * 0.66524096f);
  EXPECT_EQ(dlogits[7], 0.0f);
  for (int64_t j = 8; j < 12; ++j) EXPECT_EQ(dlogits[j], 0.0f);
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferencesAndShardedRowsAgree) {
  const int64_t rows = 4, vocab = 40;
  std::vector<float> logits = random_floats(rows * vocab, 41, -4.0f, 4.0f);
  std::vector<int64_t> targets = {3, 39, 0, 17};
  auto total_loss = [&] {
    std::vector<float> loss(rows), lse(rows);
    cross_entropy_forward(rows, vocab, logits.data(), targets.data(), loss.data(), lse.data());
    double sum = 0.0;
    for (float value : loss) sum += value;
    return sum;
  };
  std::vector<float> loss(rows), lse(rows), dlogits(rows * vocab);
  cross_entropy_forward(rows, vocab, logits.data(), targets.data(), loss.data(), lse.data());
  cross_entropy_backward(rows, vocab, logits.data(), targets.data(), lse.data(), 1.0f,
                         dlogits.data());
  expect_gradient_matches("dlogits", logits, total_loss, dlogits);

  // A vocabulary shard [16, 40) of row 1 computes the same gradient columns.
  std::vector<float> shard(24);
  kernels::cross_entropy_backward_row(24, 16, logits.data() + vocab + 16, targets[1], lse[1], 1.0f,
                                      shard.data());
  for (int64_t j = 0; j < 24; ++j) EXPECT_EQ(shard[j], dlogits[vocab + 16 + j]) << j;
}

TEST(Embedding, GathersAndScatterAddsInPositionOrder) {
  const int64_t dim = 3;
  std::vector<float> table = {0, 1, 2, 10, 11, 12, 20, 21, 22};  // rows 0..2
  std::vector<int64_t> tokens = {1, 0, 1, 5};
  std::vector<float> out(4 * dim);
  // This rank holds vocabulary rows [4, 7): only token 5 (local row 1) is local.
  embedding_forward(4, dim, tokens.data(), table.data(), 4, 3, out.data());
  EXPECT_EQ(out, (std::vector<float>{0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 11, 12}));
  embedding_forward(4, dim, tokens.data(), table.data(), 0, 3, out.data());
  EXPECT_EQ(out, (std::vector<float>{10, 11, 12, 0, 1, 2, 10, 11, 12, 0, 0, 0}));

  std::vector<float> dout = {1, 2, 3, 4, 5, 6, 7, 8, 9, 100, 100, 100};
  std::vector<float> dtable(9, 0.5f);
  embedding_backward(4, dim, tokens.data(), dout.data(), 0, 3, dtable.data());
  EXPECT_EQ(dtable, (std::vector<float>{4.5f, 5.5f, 6.5f, 8.5f, 10.5f, 12.5f, 0.5f, 0.5f, 0.5f}));

  // Many repeats of few tokens: the column-per-thread form gives the same bits.
  const int64_t positions = 200, wide = 16;
  std::vector<int64_t> many(positions);
  for (int64_t r = 0; r < positions; ++r) many[r] = (r * 7) % 5;
  std::vector<float> grads = random_floats(positions * wide, 51);
  std::vector<float> by_row(5 * wide, 0.0f), by_column(5 * wide, 0.0f);
  embedding_backward(positions, wide, many.data(), grads.data(), 0, 5, by_row.data());
  for (int64_t col = 0; col < wide; ++col) {
    kernels::embedding_backward_column(positions, wide, col, many.data(), grads.data(), 0, 5,
                                       by_column.data());
  }
  EXPECT_TRUE(bitwise_equal(by_row, by_column));
}

TEST(AdamW, TwoStepsByHand) {
  // lr 0.1, beta1 0.9, beta2 0.999, eps 1e-8, weight decay 0.01; p0 = 1, m0 = v0 = 0.
  // Step 1, g = 0.5: p = 1 * (1 - 0.001) = 0.999; m = 0.05; v = 0.001 * 0.25 = 0.00025;
  //   m_hat = 0.05 / 0.1 = 0.5; v_hat = 0.00025 / 0.001 = 0.25; sqrt = 0.5;
  //   p = 0.999 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.899000002.
  // Step 2, g = -0.25: p = 0.899000002 * 0.999 = 0.898101002; m = 0.045 - 0.025 = 0.02;
  //   v = 0.999 * 0.00025 + 0.001 * 0.0625 = 0.00031225; c1 = 1 - 0.81 = 0.19;
  //   c2 = 1 - 0.998001 = 0.001999; m_hat = 0.10526316; v_hat = 0.15620310;
  //   sqrt = 0.39522538; p = 0.898101002 - 0.1 * 0.26633574 = 0.87146730.
  // v and c2 are sensitive to beta2's float rounding: 0.999f = 0.99900001287 and
  // 1 - 0.999f = 0.00099998713, so v1 = 0.00024999678, v2 = 0.00031224598 and
  // c2 = 1 - 0.99900001287^2 = 0.0019989742 (p moves by less than 1e-8).
  float p = 1.0f, m = 0.0f, v = 0.0f;
  kernels::AdamWStep step1 = kernels::make_adamw_step(1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f);
  EXPECT_FLOAT_EQ(step1.bias_correction1, 0.1f);
  adamw_update(step1, 1, std::vector<float>{0.5f}.data(), &p, &m, &v);
  EXPECT_FLOAT_EQ(p, 0.899000002f);
  EXPECT_FLOAT_EQ(m, 0.05f);
  EXPECT_FLOAT_EQ(v, 0.00024999678f);
  kernels::AdamWStep step2 = kernels::make_adamw_step(2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f);
  EXPECT_FLOAT_EQ(step2.bias_correction2, 0.0019989742f);
  adamw_update(step2, 1, std::vector<float>{-0.25f}.data(), &p, &m, &v);
  EXPECT_FLOAT_EQ(p, 0.87146730f);
  EXPECT_FLOAT_EQ(m, 0.02f);
  EXPECT_FLOAT_EQ(v, 0.00031224598f);
}

TEST(RowKernels, RepeatBitwise) {
  const int64_t rows = 7, dim = 96;
  std::vector<float> x = random_floats(rows * dim, 61), gain = random_floats(dim, 62);
  std::vector<float> dy = random_floats(rows * dim, 63);
  auto run = [&] {
    std::vector<float> y(rows * dim), rstd(rows), dx(rows * dim), dgain(dim, 0.0f);
    rmsnorm_forward(rows, dim, x.data(), gain.data(), 1e-6f, y.data(), rstd.data());
    rmsnorm_backward(rows, dim, x.data(), gain.data(), rstd.data(), dy.data(), dx.data(),
                     dgain.data());
    std::vector<float> gate_out(rows * dim / 2), d_gate_up(rows * dim);
    swiglu_forward(rows, dim / 2, y.data(), gate_out.data());
    swiglu_backward(rows, dim / 2, y.data(), dy.data(), d_gate_up.data());
    std::vector<int64_t> targets = {0, 5, 95, 3, -1, 7, 50};
    std::vector<float> loss(rows), lse(rows), dlogits(rows * dim);
    cross_entropy_forward(rows, dim, x.data(), targets.data(), loss.data(), lse.data());
    cross_entropy_backward(rows, dim, x.data(), targets.data(), lse.data(), 0.25f, dlogits.data());
    std::vector<float> params = gain, m(dim, 0.0f), v(dim, 0.0f);
    adamw_update(kernels::make_adamw_step(3, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f), dim, dgain.data(),
                 params.data(), m.data(), v.data());
    std::vector<float> all;
    for (const auto* part :
         {&y, &rstd, &dx, &dgain, &gate_out, &d_gate_up, &loss, &lse, &dlogits, &params, &m, &v}) {
      all.insert(all.end(), part->begin(), part->end());
    }
    return all;
  };
  EXPECT_TRUE(bitwise_equal(run(), run()));
}

}  // namespace
}  // namespace dhelix::cpu
