// The CUDA embedding backward's decomposition (runtime/cuda/kernels_embedding.cu: a stable
// radix sort of the positions by token, then a run per token), run by its host twin
// (runtime/cpu/embedding_twin.h), against the CPU backend's row loop: the same fp32 sums
// bit for bit, since both add a token's rows in ascending position order. Cases: the
// file's worked example, repeated tokens, tokens of another shard, P not a multiple of the
// 256-position tile, a shard of 70000 rows (17-bit keys: three 8-bit passes).

#include "runtime/cpu/embedding_twin.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "runtime/cpu/kernels_cpu.h"
#include "runtime/kernels/embedding.h"

namespace dhelix::cpu {
namespace {

size_t sized(int64_t n) { return static_cast<size_t>(n); }

TEST(EmbeddingTwin, SortsTheWorkedExample) {
  // kernels_embedding.cu: tokens [3 1 3 7 1 3], shard [0, 5): keys [4 2 4 0 2 4].
  const std::vector<int64_t> tokens{3, 1, 3, 7, 1, 3};
  const EmbeddingSortedPositions s = embedding_radix_sort(6, tokens.data(), 0, 5);
  EXPECT_EQ(s.sorted_keys, (std::vector<uint32_t>{0, 2, 2, 4, 4, 4}));
  EXPECT_EQ(s.order, (std::vector<int32_t>{3, 1, 4, 0, 2, 5}));
  std::vector<bool> starts;
  for (int64_t i = 0; i < 6; ++i)
    starts.push_back(kernels::embedding_run_starts(i, s.sorted_keys.data()));
  EXPECT_EQ(starts, (std::vector<bool>{false, true, false, true, false, false}));
  EXPECT_EQ(kernels::embedding_key_bits(5), 3);       // keys 0..5
  EXPECT_EQ(kernels::embedding_key_bits(70000), 17);  // three 8-bit passes
  EXPECT_EQ(kernels::embedding_key_bits(255), 8);     // key 255: one pass
}

TEST(EmbeddingTwin, ScattersAsTheCpuRowLoopBitForBit) {
  std::mt19937 engine(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Shape {
    int64_t positions, dim, vocab_begin, vocab_local, vocab;
  };
  for (const Shape& c :
       {Shape{6, 3, 0, 5, 8}, Shape{1000, 8, 100, 300, 500}, Shape{777, 4, 0, 70000, 70000}}) {
    SCOPED_TRACE(::testing::Message() << "P " << c.positions << " vocab_local " << c.vocab_local);
    std::vector<int64_t> tokens(sized(c.positions));
    // Few distinct tokens so that runs are long, some outside the shard.
    for (int64_t& t : tokens) {
      t = static_cast<int64_t>(engine() % 37) * std::max<int64_t>(1, c.vocab / 37) % c.vocab;
    }
    std::vector<float> dout(sized(c.positions * c.dim));
    for (float& v : dout) v = normal(engine);
    std::vector<float> want(sized(c.vocab_local * c.dim));
    for (float& v : want) v = normal(engine);  // the gradient accumulates
    std::vector<float> got = want;
    embedding_backward(c.positions, c.dim, tokens.data(), dout.data(), c.vocab_begin, c.vocab_local,
                       want.data());
    embedding_backward_sorted(c.positions, c.dim, tokens.data(), dout.data(), c.vocab_begin,
                              c.vocab_local, got.data());
    EXPECT_EQ(got, want);
    // The radix passes give std::stable_sort's order.
    const EmbeddingSortedPositions s =
        embedding_radix_sort(c.positions, tokens.data(), c.vocab_begin, c.vocab_local);
    std::vector<int32_t> order(sized(c.positions));
    std::iota(order.begin(), order.end(), 0);
    auto key = [&](int32_t r) {
      return kernels::embedding_sort_key(tokens[sized(r)], c.vocab_begin, c.vocab_local);
    };
    std::stable_sort(order.begin(), order.end(),
                     [&key](int32_t a, int32_t b) { return key(a) < key(b); });
    EXPECT_EQ(s.order, order);
  }
}

}  // namespace
}  // namespace dhelix::cpu
