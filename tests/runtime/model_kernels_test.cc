// The CPU kernels the StageModel adds: residual add, QKV split/merge, and the pieces of the
// vocabulary-parallel cross-entropy.

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "runtime/cpu/kernels_cpu.h"
#include "tests/runtime/kernel_test_util.h"

namespace dhelix::cpu {
namespace {

TEST(ModelKernelsTest, AddTensorsMayAliasItsOutput) {
  std::vector<float> a = {1.0f, -2.0f, 0.5f}, b = {0.25f, 2.0f, 1.5f};
  add_tensors(3, a.data(), b.data(), a.data());
  EXPECT_EQ(a, (std::vector<float>{1.25f, 0.0f, 2.0f}));
}

TEST(ModelKernelsTest, SplitAndMergeQkvAreInverse) {
  // Two rows of q width 2, kv width 1: [q0 q1 | k | v].
  const std::vector<float> qkv = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> q(4), k(2), v(2), back(8);
  split_qkv(2, 2, 1, qkv.data(), q.data(), k.data(), v.data());
  EXPECT_EQ(q, (std::vector<float>{1, 2, 5, 6}));
  EXPECT_EQ(k, (std::vector<float>{3, 7}));
  EXPECT_EQ(v, (std::vector<float>{4, 8}));
  merge_qkv(2, 2, 1, q.data(), k.data(), v.data(), back.data());
  EXPECT_EQ(back, qkv);
}

TEST(ModelKernelsTest, VocabParallelLossOfTwoShardsByHand) {
  // One row, logits [0, ln 3] split into shards of one column: lse = ln(1 + 3) = ln 4.
  const float logits[2] = {0.0f, std::log(3.0f)};
  const int64_t target = 0;
  std::vector<float> stats(6);
  vocab_parallel_stats(1, 1, 0, &logits[0], &target, stats.data());
  vocab_parallel_stats(1, 1, 1, &logits[1], &target, stats.data() + 3);
  EXPECT_EQ(stats, (std::vector<float>{0.0f, 1.0f, 0.0f, std::log(3.0f), 1.0f, 0.0f}));
  float lse = 0.0f, loss = 0.0f;
  vocab_parallel_combine(1, 2, 1, stats.data(), &target, &lse, &loss);
  EXPECT_NEAR(lse, std::log(4.0f), 1e-6);
  EXPECT_NEAR(loss, std::log(4.0f), 1e-6);
  std::vector<float> dlogits(2);
  vocab_parallel_backward(1, 1, 1, &logits[1], &target, &lse, 2.0f, dlogits.data());
  EXPECT_NEAR(dlogits[0], 2.0f * 0.75f, 1e-6);  // softmax 3/4, not the target
  vocab_parallel_backward(1, 1, 0, &logits[0], &target, &lse, 2.0f, dlogits.data());
  EXPECT_NEAR(dlogits[0], 2.0f * (0.25f - 1.0f), 1e-6);
}

TEST(ModelKernelsTest, VocabParallelMatchesWholeRowLoss) {
  const int64_t rows = 3, vocab = 10, shard = 4;  // shards of 4, 4 and 2 columns
  const std::vector<float> logits = test::random_floats(rows * vocab, 9, -3.0f, 3.0f);
  const std::vector<int64_t> targets = {9, -1, 4};
  std::vector<float> want_loss(rows), want_lse(rows);
  cross_entropy_forward(rows, vocab, logits.data(), targets.data(), want_loss.data(),
                        want_lse.data());
  std::vector<float> stats(3 * rows * 3);
  for (int64_t s = 0; s < 3; ++s) {
    const int64_t begin = s * shard, width = std::min(shard, vocab - begin);
    std::vector<float> part(static_cast<size_t>(rows * width));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < width; ++j) part[r * width + j] = logits[r * vocab + begin + j];
    }
    vocab_parallel_stats(rows, width, begin, part.data(), targets.data(),
                         stats.data() + s * rows * 3);
  }
  std::vector<float> lse(rows), loss(rows);
  vocab_parallel_combine(rows, 3, shard, stats.data(), targets.data(), lse.data(), loss.data());
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_NEAR(lse[r], want_lse[r], 1e-5) << r;
    EXPECT_NEAR(loss[r], want_loss[r], 1e-5) << r;
  }
  EXPECT_EQ(loss[1], 0.0f);  // ignored target
}

TEST(ModelKernelsTest, OneShardGivesTheWholeRowLossBitwise) {
  const int64_t rows = 4, vocab = 37;
  const std::vector<float> logits = test::random_floats(rows * vocab, 10, -4.0f, 4.0f);
  const std::vector<int64_t> targets = {0, 36, 5, 17};
  std::vector<float> want_loss(rows), want_lse(rows), stats(rows * 3), lse(rows), loss(rows);
  cross_entropy_forward(rows, vocab, logits.data(), targets.data(), want_loss.data(),
                        want_lse.data());
  vocab_parallel_stats(rows, vocab, 0, logits.data(), targets.data(), stats.data());
  vocab_parallel_combine(rows, 1, vocab, stats.data(), targets.data(), lse.data(), loss.data());
  EXPECT_TRUE(test::bitwise_equal(lse, want_lse));
  EXPECT_TRUE(test::bitwise_equal(loss, want_loss));
}

}  // namespace
}  // namespace dhelix::cpu
