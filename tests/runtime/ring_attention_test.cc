// Context parallelism's ring attention (runtime/cpu/ring_attention_cpu.h) against causal
// attention over the whole sequence (CP 1): the load-balanced split, the outputs, lse and
// the gradients dq, dk, dv, to the tolerance docs/kernels.md states.

#include "runtime/cpu/ring_attention_cpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "runtime/cpu/kernels_cpu.h"
#include "runtime/kernels/context_parallel.h"
#include "tests/runtime/cp_local_rows.h"

namespace dhelix::cpu {
namespace {

using kernels::AttentionShape;

// docs/kernels.md: ring attention equals CP 1 within this absolute + relative tolerance.
constexpr float kTolerance = 2e-5f;

std::vector<float> random_values(size_t count, uint32_t seed) {
  std::mt19937 engine(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = normal(engine);
  return v;
}

using test::local_rows;  // tests/runtime/cp_local_rows.h

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], kTolerance * (1.0f + std::abs(want[i]))) << what << " " << i;
  }
}

// Runs the ring of `cp` ranks in one process and compares every rank's slice of out, lse,
// dq, dk and dv with the full-sequence attention.
void check_ring_equals_full(int64_t cp, int64_t seq, int64_t heads, int64_t kv_heads) {
  const int64_t batch = 2, d = 16;
  const AttentionShape full{batch, seq, heads, kv_heads, d};
  const size_t q_count = static_cast<size_t>(batch * seq * heads * d);
  const size_t kv_count = static_cast<size_t>(batch * seq * kv_heads * d);
  const std::vector<float> q = random_values(q_count, 1), k = random_values(kv_count, 2),
                           v = random_values(kv_count, 3), dout = random_values(q_count, 4);
  std::vector<float> out(q_count), lse(static_cast<size_t>(batch * heads * seq)), dq(q_count),
      dk(kv_count), dv(kv_count);
  attention_forward(full, q.data(), k.data(), v.data(), kernels::kAttentionTileKeys, out.data(),
                    lse.data());
  attention_backward(full, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(),
                     dq.data(), dk.data(), dv.data());

  const int64_t c = seq / (2 * cp);
  const AttentionShape local{batch, 2 * c, heads, kv_heads, d};
  const int64_t q_width = heads * d, kv_width = kv_heads * d;
  std::vector<std::vector<float>> lq, lk, lv, ldout, lout(cp), llse(cp), ldq(cp), ldk(cp), ldv(cp);
  for (int64_t r = 0; r < cp; ++r) {
    lq.push_back(local_rows(q, batch, seq, q_width, cp, r));
    lk.push_back(local_rows(k, batch, seq, kv_width, cp, r));
    lv.push_back(local_rows(v, batch, seq, kv_width, cp, r));
    ldout.push_back(local_rows(dout, batch, seq, q_width, cp, r));
  }
  for (int64_t r = 0; r < cp; ++r) {
    RingForwardState state;
    state.reset(local);
    for (int64_t s = 0; s < cp; ++s) {
      const int64_t src = (r - s + cp) % cp;
      ring_attention_forward_step(local, {cp, r, src, c}, lq[r].data(), lk[src].data(),
                                  lv[src].data(), state);
    }
    lout[r].resize(lq[r].size());
    llse[r].resize(static_cast<size_t>(batch * heads * 2 * c));
    ring_attention_forward_finish(local, state, lout[r].data(), llse[r].data());
    expect_close(lout[r], local_rows(out, batch, seq, q_width, cp, r), "out");
    ldq[r].assign(lq[r].size(), 0.0f);
    ldk[r].assign(lk[r].size(), 0.0f);
    ldv[r].assign(lv[r].size(), 0.0f);
  }
  // The backward ring: the block's dk/dv travel with it and are home after cp steps.
  for (int64_t s = 0; s < cp; ++s) {
    for (int64_t r = 0; r < cp; ++r) {
      const int64_t src = (r - s + cp) % cp;
      std::vector<float> delta(llse[r].size());
      ring_attention_backward_delta(local, lout[r].data(), ldout[r].data(), delta.data());
      ring_attention_backward_step(local, {cp, r, src, c}, lq[r].data(), ldout[r].data(),
                                   llse[r].data(), delta.data(), lk[src].data(), lv[src].data(),
                                   ldq[r].data(), ldk[src].data(), ldv[src].data());
    }
  }
  for (int64_t r = 0; r < cp; ++r) {
    ring_attention_scale(local, static_cast<int64_t>(ldq[r].size()), ldq[r].data());
    ring_attention_scale(local, static_cast<int64_t>(ldk[r].size()), ldk[r].data());
    expect_close(ldq[r], local_rows(dq, batch, seq, q_width, cp, r), "dq");
    expect_close(ldk[r], local_rows(dk, batch, seq, kv_width, cp, r), "dk");
    expect_close(ldv[r], local_rows(dv, batch, seq, kv_width, cp, r), "dv");
    // lse [batch, heads, 2c] against the full [batch, heads, S].
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < 2 * c; ++i) {
          const int64_t p = kernels::cp_global_position(cp, r, c, i);
          EXPECT_NEAR(llse[r][static_cast<size_t>((b * heads + h) * 2 * c + i)],
                      lse[static_cast<size_t>((b * heads + h) * seq + p)], kTolerance * 10);
        }
      }
    }
  }
}

TEST(ContextParallelSplit, RankHoldsChunksIAnd2CpMinus1MinusI) {
  // cp = 2, S = 8, c = 2 (the table of context_parallel.h).
  std::vector<int64_t> rank0, rank1;
  for (int64_t i = 0; i < 4; ++i) {
    rank0.push_back(kernels::cp_global_position(2, 0, 2, i));
    rank1.push_back(kernels::cp_global_position(2, 1, 2, i));
  }
  EXPECT_EQ(rank0, (std::vector<int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(rank1, (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(kernels::visible_keys(5, 4, 2), 2);
  EXPECT_EQ(kernels::visible_keys(4, 4, 2), 1);
  EXPECT_EQ(kernels::visible_keys(3, 4, 2), 0);
  EXPECT_EQ(kernels::first_seeing_query(5, 4, 2), 1);
  EXPECT_EQ(kernels::first_seeing_query(7, 4, 2), 2);
}

// RoPE positions follow the rank's chunks: the local rows rotated at their global positions
// are bitwise the whole sequence's rotated rows, and the backward inverts the forward.
TEST(ContextParallelSplit, TilesOfAChunkSplitTheVisibleKeysAndSeeingQueries) {
  // 150 visible keys in tiles of 64: 64, 64, 22, then none.
  EXPECT_EQ(kernels::keys_in_tile(150, 0, 64), 64);
  EXPECT_EQ(kernels::keys_in_tile(150, 128, 64), 22);
  EXPECT_EQ(kernels::keys_in_tile(150, 192, 64), 0);
  EXPECT_EQ(kernels::keys_in_tile(0, 0, 64), 0);
  // A key first seen by query 70 of a chunk: none of tile [0, 64), from offset 6 of tile
  // [64, 128) on, all of a later tile; staged rows bound the offset.
  EXPECT_EQ(kernels::first_query_in_tile(70, 0, 64), 64);
  EXPECT_EQ(kernels::first_query_in_tile(70, 64, 64), 6);
  EXPECT_EQ(kernels::first_query_in_tile(70, 128, 10), 0);
  EXPECT_EQ(kernels::first_query_in_tile(70, 64, 5), 5);
  // Summed over the tiles, exactly the visible keys and the seeing queries.
  for (int64_t visible = 0; visible <= 200; visible += 7) {
    int64_t keys = 0;
    for (int64_t t = 0; t < 200; t += 64) keys += kernels::keys_in_tile(visible, t, 64);
    EXPECT_EQ(keys, visible);
  }
  for (int64_t first = 0; first <= 150; first += 5) {
    int64_t queries = 0;
    for (int64_t t = 0; t < 150; t += 64) {
      const int64_t staged = std::min<int64_t>(64, 150 - t);
      queries += staged - kernels::first_query_in_tile(first, t, staged);
    }
    EXPECT_EQ(queries, 150 - first);
  }
}

TEST(ContextParallelSplit, RopeUsesTheChunksGlobalPositions) {
  const int64_t batch = 2, seq = 32, heads = 3, d = 8, cp = 4;
  const RopeTable table = make_rope_table(seq, d, 10000.0);
  const std::vector<float> x = random_values(static_cast<size_t>(batch * seq * heads * d), 9);
  std::vector<float> rotated = x;
  rope_forward(table, batch, seq, heads, 0, rotated.data());
  for (int64_t r = 0; r < cp; ++r) {
    std::vector<float> local = local_rows(x, batch, seq, heads * d, cp, r);
    const std::vector<float> original = local;
    rope_forward_cp(table, batch, cp, r, seq / (2 * cp), heads, local.data());
    EXPECT_EQ(local, local_rows(rotated, batch, seq, heads * d, cp, r)) << "rank " << r;
    rope_backward_cp(table, batch, cp, r, seq / (2 * cp), heads, local.data());
    for (size_t i = 0; i < local.size(); ++i) ASSERT_NEAR(local[i], original[i], 1e-5f) << i;
  }
}

TEST(RingAttention, Cp2EqualsCp1WithGradients) { check_ring_equals_full(2, 32, 4, 2); }

TEST(RingAttention, Cp4EqualsCp1WithGradients) { check_ring_equals_full(4, 64, 4, 1); }

// Chunks longer than a key tile: the fold splits them into tiles.
TEST(RingAttention, ChunksLongerThanATileEqualCp1) { check_ring_equals_full(2, 320, 2, 2); }

}  // namespace
}  // namespace dhelix::cpu
