// Causal GQA flash attention: the forward against a naive double-precision
// softmax(QK^T / sqrt(d) + causal mask) V, tile-size independence, the backward against
// finite differences and against a naive double backward, and bitwise repeatability.

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/cpu/kernels_cpu.h"
#include "tests/runtime/kernel_test_util.h"

namespace dhelix::cpu {
namespace {

using kernels::AttentionShape;
using test::bitwise_equal;
using test::expect_gradient_matches;
using test::random_floats;
using test::weighted_sum;

struct Tensors {
  std::vector<float> q, k, v;
};

Tensors make_inputs(const AttentionShape& s, uint32_t seed) {
  int64_t q_size = s.batch * s.seq * s.heads * s.head_dim;
  int64_t kv_size = s.batch * s.seq * s.kv_heads * s.head_dim;
  return {random_floats(q_size, seed, -2.0f, 2.0f), random_floats(kv_size, seed + 1, -2.0f, 2.0f),
          random_floats(kv_size, seed + 2)};
}

int64_t q_index(const AttentionShape& s, int64_t b, int64_t i, int64_t h, int64_t d) {
  return ((b * s.seq + i) * s.heads + h) * s.head_dim + d;
}
int64_t kv_index(const AttentionShape& s, int64_t b, int64_t j, int64_t g, int64_t d) {
  return ((b * s.seq + j) * s.kv_heads + g) * s.head_dim + d;
}

// Probabilities p[b][h][i][j] of the naive formula, in double; zero above the diagonal.
std::vector<double> naive_probabilities(const AttentionShape& s, const Tensors& t) {
  std::vector<double> p(s.batch * s.heads * s.seq * s.seq, 0.0);
  double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  int64_t group = s.heads / s.kv_heads;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t i = 0; i < s.seq; ++i) {
        double* row = &p[((b * s.heads + h) * s.seq + i) * s.seq];
        double max_score = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < s.head_dim; ++d) {
            dot += static_cast<double>(t.q[q_index(s, b, i, h, d)]) *
                   t.k[kv_index(s, b, j, h / group, d)];
          }
          row[j] = dot * scale;
          max_score = std::max(max_score, row[j]);
        }
        for (int64_t j = 0; j <= i; ++j) sum += (row[j] = std::exp(row[j] - max_score));
        for (int64_t j = 0; j <= i; ++j) row[j] /= sum;
      }
    }
  }
  return p;
}

std::vector<double> naive_output(const AttentionShape& s, const Tensors& t,
                                 const std::vector<double>& p) {
  std::vector<double> out(t.q.size(), 0.0);
  int64_t group = s.heads / s.kv_heads;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t i = 0; i < s.seq; ++i) {
        for (int64_t j = 0; j <= i; ++j) {
          double pij = p[((b * s.heads + h) * s.seq + i) * s.seq + j];
          for (int64_t d = 0; d < s.head_dim; ++d) {
            out[q_index(s, b, i, h, d)] += pij * t.v[kv_index(s, b, j, h / group, d)];
          }
        }
      }
    }
  }
  return out;
}

void expect_forward_matches_naive(const AttentionShape& s, int64_t tile_keys) {
  Tensors t = make_inputs(s, 100);
  std::vector<float> out(t.q.size()), lse(s.batch * s.heads * s.seq);
  attention_forward(s, t.q.data(), t.k.data(), t.v.data(), tile_keys, out.data(), lse.data());
  std::vector<double> expected = naive_output(s, t, naive_probabilities(s, t));
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], expected[i], 1e-5) << i;
}

TEST(Attention, ForwardMatchesNaiveSoftmaxForMultiHeadGroupedAndMultiQuery) {
  expect_forward_matches_naive({2, 9, 4, 4, 8}, 4);    // heads = kv heads
  expect_forward_matches_naive({2, 9, 4, 2, 8}, 4);    // GQA, groups of 2
  expect_forward_matches_naive({1, 17, 6, 1, 16}, 5);  // one kv head for all
}

TEST(Attention, FirstQueryAttendsOnlyToItselfAndLseIsTheLogSumExp) {
  AttentionShape s{1, 3, 1, 1, 4};
  Tensors t = make_inputs(s, 7);
  std::vector<float> out(t.q.size()), lse(3);
  attention_forward(s, t.q.data(), t.k.data(), t.v.data(), 2, out.data(), lse.data());
  for (int64_t d = 0; d < 4; ++d) EXPECT_EQ(out[d], t.v[d]);
  // lse_1 = log(exp(s_10) + exp(s_11)) with s = q . k / 2.
  double s10 = 0.0, s11 = 0.0;
  for (int64_t d = 0; d < 4; ++d) {
    s10 += static_cast<double>(t.q[4 + d]) * t.k[d] / 2.0;
    s11 += static_cast<double>(t.q[4 + d]) * t.k[4 + d] / 2.0;
  }
  EXPECT_NEAR(lse[1], std::log(std::exp(s10) + std::exp(s11)), 1e-6);
}

TEST(Attention, TileSizesAgreeAndTheSameTileRepeatsBitwise) {
  AttentionShape s{2, 33, 4, 2, 16};
  Tensors t = make_inputs(s, 200);
  auto run = [&](int64_t tile_keys) {
    std::vector<float> out(t.q.size()), lse(s.batch * s.heads * s.seq);
    attention_forward(s, t.q.data(), t.k.data(), t.v.data(), tile_keys, out.data(), lse.data());
    out.insert(out.end(), lse.begin(), lse.end());
    return out;
  };
  std::vector<float> whole = run(64);  // one tile covers every row
  for (int64_t tile : {1, 3, 8, 32}) {
    std::vector<float> tiled = run(tile);
    for (size_t i = 0; i < whole.size(); ++i) {
      EXPECT_NEAR(tiled[i], whole[i], 1e-6) << "tile " << tile << " element " << i;
    }
    EXPECT_TRUE(bitwise_equal(tiled, run(tile))) << "tile " << tile;
  }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  AttentionShape s{2, 5, 4, 2, 8};
  Tensors t = make_inputs(s, 300);
  std::vector<float> probe = random_floats(t.q.size(), 303);
  auto loss = [&] {
    std::vector<float> out(t.q.size()), lse(s.batch * s.heads * s.seq);
    attention_forward(s, t.q.data(), t.k.data(), t.v.data(), 2, out.data(), lse.data());
    return weighted_sum(probe, out);
  };
  std::vector<float> out(t.q.size()), lse(s.batch * s.heads * s.seq);
  attention_forward(s, t.q.data(), t.k.data(), t.v.data(), 2, out.data(), lse.data());
  std::vector<float> dq(t.q.size()), dk(t.k.size()), dv(t.v.size());
  attention_backward(s, t.q.data(), t.k.data(), t.v.data(), out.data(), lse.data(), probe.data(),
                     dq.data(), dk.data(), dv.data());
  expect_gradient_matches("dq", t.q, loss, dq);
  expect_gradient_matches("dk", t.k, loss, dk);
  expect_gradient_matches("dv", t.v, loss, dv);
}

TEST(Attention, BackwardMatchesNaiveDoubleBackwardAndRepeatsBitwise) {
  AttentionShape s{2, 12, 6, 2, 8};
  Tensors t = make_inputs(s, 400);
  std::vector<float> dout = random_floats(t.q.size(), 404);
  std::vector<float> out(t.q.size()), lse(s.batch * s.heads * s.seq);
  attention_forward(s, t.q.data(), t.k.data(), t.v.data(), 4, out.data(), lse.data());
  auto run = [&] {
    std::vector<float> dq(t.q.size()), dk(t.k.size()), dv(t.v.size());
    attention_backward(s, t.q.data(), t.k.data(), t.v.data(), out.data(), lse.data(), dout.data(),
                       dq.data(), dk.data(), dv.data());
    dq.insert(dq.end(), dk.begin(), dk.end());
    dq.insert(dq.end(), dv.begin(), dv.end());
    return dq;
  };
  std::vector<float> grads = run();
  EXPECT_TRUE(bitwise_equal(grads, run()));

  // Naive backward: dP = dO V^T, dS = P (dP - rowsum(dO o O)), dQ = scale dS K, ...
  std::vector<double> p = naive_probabilities(s, t);
  std::vector<double> expected(grads.size(), 0.0);
  double* dq = expected.data();
  double* dk = dq + t.q.size();
  double* dv = dk + t.k.size();
  double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  int64_t group = s.heads / s.kv_heads;
  std::vector<double> o = naive_output(s, t, p);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t i = 0; i < s.seq; ++i) {
        double delta = 0.0;
        for (int64_t d = 0; d < s.head_dim; ++d) {
          delta += dout[q_index(s, b, i, h, d)] * o[q_index(s, b, i, h, d)];
        }
        for (int64_t j = 0; j <= i; ++j) {
          double pij = p[((b * s.heads + h) * s.seq + i) * s.seq + j];
          double dp = 0.0;
          for (int64_t d = 0; d < s.head_dim; ++d) {
            dp += dout[q_index(s, b, i, h, d)] *
                  static_cast<double>(t.v[kv_index(s, b, j, h / group, d)]);
          }
          double ds = pij * (dp - delta);
          for (int64_t d = 0; d < s.head_dim; ++d) {
            int64_t qi = q_index(s, b, i, h, d), kj = kv_index(s, b, j, h / group, d);
            dq[qi] += scale * ds * t.k[kj];
            dk[kj] += scale * ds * t.q[qi];
            dv[kj] += pij * dout[qi];
          }
        }
      }
    }
  }
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_NEAR(grads[i], expected[i], 2e-5) << i;
}

}  // namespace
}  // namespace dhelix::cpu
