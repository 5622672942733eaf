// The host twin of the tensor-core attention kernels (runtime/cpu/attention_tc_twin.h)
// against a naive double-precision causal attention over the whole sequence: plain causal
// attention (MHA, GQA, MQA) and context parallelism's ring with every rank and every ring
// offset, lengths that fill no tile (a 16-row slice straddling the two chunks of a rank).
//
// The bound (docs/kernels.md): the twin rounds each P (forward, dv) and dS (dq, dk) term to
// bf16 before it multiplies, a relative error of at most 2^-8 per term (bf16 keeps 8
// significant bits), so every output element x = sum_t term_t is within 2^-8 * sum_t |term_t|
// (computed here in double next to the reference) plus fp32 reordering, 1e-5 * (1 + |x|). lse sums
// the fp32 P: 1e-5 (1 + |x|). The backward is given the reference's lse and delta, so each pass is
// checked on its own.

#include "runtime/cpu/attention_tc_twin.h"

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

constexpr double kTermRounding = 1.0 / 256.0;  // 2^-8: bf16's unit roundoff
constexpr double kReorder = 1e-5;

std::vector<float> bf16_values(int64_t count, uint32_t seed) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = round_bf16(uniform(engine));
  return v;
}

// Whole-sequence tensors, their naive causal attention in double, and each output's sum of
// absolute terms (the rounding bound's weight).
struct Reference {
  AttentionShape shape;
  std::vector<float> q, k, v, dout, out, lse, delta, dq, dk, dv;
  std::vector<double> abs_out, abs_dq, abs_dk, abs_dv;
};

Reference make_reference(const AttentionShape& s, uint32_t seed) {
  Reference r;
  r.shape = s;
  const int64_t qn = s.batch * s.seq * s.heads * s.head_dim;
  const int64_t kn = s.batch * s.seq * s.kv_heads * s.head_dim;
  r.q = bf16_values(qn, seed);
  r.k = bf16_values(kn, seed + 1);
  r.v = bf16_values(kn, seed + 2);
  r.dout = bf16_values(qn, seed + 3);
  const int64_t d = s.head_dim, group = s.heads / s.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> out(qn), dq(qn), dk(kn), dv(kn);
  r.abs_out.assign(qn, 0.0);
  r.abs_dq.assign(qn, 0.0);
  r.abs_dk.assign(kn, 0.0);
  r.abs_dv.assign(kn, 0.0);
  r.lse.resize(s.batch * s.heads * s.seq);
  r.delta.resize(r.lse.size());
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return ((b * s.seq + t) * s.heads + h) * d; };
  auto kj = [&](int64_t b, int64_t t, int64_t h) { return ((b * s.seq + t) * s.kv_heads + h) * d; };
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kvh = h / group;
      for (int64_t i = 0; i < s.seq; ++i) {
        std::vector<double> p(static_cast<size_t>(i + 1));
        double max_score = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t e = 0; e < d; ++e)
            dot += double{r.q[qi(b, i, h) + e]} * r.k[kj(b, j, kvh) + e];
          p[j] = dot * scale;
          max_score = std::max(max_score, p[j]);
        }
        for (double& x : p) sum += (x = std::exp(x - max_score));
        const int64_t st = (b * s.heads + h) * s.seq + i;
        r.lse[st] = static_cast<float>(max_score + std::log(sum));
        double delta = 0.0;
        for (int64_t e = 0; e < d; ++e) {
          double o = 0.0, a = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            o += p[j] / sum * r.v[kj(b, j, kvh) + e];
            a += p[j] / sum * std::abs(r.v[kj(b, j, kvh) + e]);
          }
          out[qi(b, i, h) + e] = o;
          r.abs_out[qi(b, i, h) + e] = a;
          delta += o * r.dout[qi(b, i, h) + e];
        }
        r.delta[st] = static_cast<float>(delta);
        for (int64_t j = 0; j <= i; ++j) {
          const double pj = p[j] / sum;
          double dp = 0.0;
          for (int64_t e = 0; e < d; ++e)
            dp += double{r.dout[qi(b, i, h) + e]} * r.v[kj(b, j, kvh) + e];
          const double ds = pj * (dp - delta);
          for (int64_t e = 0; e < d; ++e) {
            const double qe = r.q[qi(b, i, h) + e], ke = r.k[kj(b, j, kvh) + e];
            const double de = r.dout[qi(b, i, h) + e];
            dq[qi(b, i, h) + e] += scale * ds * ke;
            r.abs_dq[qi(b, i, h) + e] += scale * std::abs(ds * ke);
            dk[kj(b, j, kvh) + e] += scale * ds * qe;
            r.abs_dk[kj(b, j, kvh) + e] += scale * std::abs(ds * qe);
            dv[kj(b, j, kvh) + e] += pj * de;
            r.abs_dv[kj(b, j, kvh) + e] += std::abs(pj * de);
          }
        }
      }
    }
  }
  r.out.assign(out.begin(), out.end());
  r.dq.assign(dq.begin(), dq.end());
  r.dk.assign(dk.begin(), dk.end());
  r.dv.assign(dv.begin(), dv.end());
  return r;
}

void expect_within(const std::vector<float>& got, const std::vector<float>& want,
                   const std::vector<double>& abs_terms, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = kTermRounding * abs_terms[i] + kReorder * (1.0 + std::abs(want[i]));
    ASSERT_NEAR(got[i], want[i], bound) << what << " element " << i;
  }
}

void expect_lse(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], kReorder * (1.0 + std::abs(want[i]))) << "lse row " << i;
  }
}

void check_plain(const AttentionShape& s) {
  SCOPED_TRACE(::testing::Message() << "seq " << s.seq << ", heads " << s.heads << "/" << s.kv_heads
                                    << ", head_dim " << s.head_dim);
  const Reference r = make_reference(s, 7);
  const kernels::TokenLayout causal = kernels::causal_layout(s.seq);
  const kernels::AttentionLayouts layouts{causal, causal};
  RingForwardState state;
  state.reset(s);
  tc_twin_forward_step(s, layouts, r.q.data(), r.k.data(), r.v.data(), state);
  std::vector<float> out(r.out.size()), lse(r.lse.size());
  ring_attention_forward_finish(s, state, out.data(), lse.data());
  expect_within(out, r.out, r.abs_out, "out");
  expect_lse(lse, r.lse);

  std::vector<float> dq(r.dq.size()), dk(r.dk.size()), dv(r.dv.size());
  tc_twin_backward_dq(s, layouts, r.q.data(), r.dout.data(), r.lse.data(), r.delta.data(),
                      r.k.data(), r.v.data(), dq.data());
  tc_twin_backward_dkdv(s, layouts, r.q.data(), r.dout.data(), r.lse.data(), r.delta.data(),
                        r.k.data(), r.v.data(), dk.data(), dv.data());
  ring_attention_scale(s, static_cast<int64_t>(dq.size()), dq.data());
  ring_attention_scale(s, static_cast<int64_t>(dk.size()), dk.data());
  expect_within(dq, r.dq, r.abs_dq, "dq");
  expect_within(dk, r.dk, r.abs_dk, "dk");
  expect_within(dv, r.dv, r.abs_dv, "dv");
}

TEST(AttentionTcTwin, PlainCausalMatchesTheReference) {
  check_plain({.batch = 2, .seq = 150, .heads = 4, .kv_heads = 4, .head_dim = 32});  // MHA
  check_plain({.batch = 1, .seq = 83, .heads = 8, .kv_heads = 2, .head_dim = 24});   // GQA 4
  check_plain(
      {.batch = 1, .seq = 70, .heads = 6, .kv_heads = 1, .head_dim = 16});  // MQA, 6 > 4 warps
}

using test::local_rows;  // tests/runtime/cp_local_rows.h

// Statistics [batch, heads, seq] of rank `rank`.
std::vector<float> local_stats(const std::vector<float>& full, const AttentionShape& s, int64_t cp,
                               int64_t rank) {
  return local_rows(full, s.batch * s.heads, s.seq, 1, cp, rank);
}

// Every rank of a CP group of `cp` in one process, every ring step in ring order; each
// rank's out, lse, dq and the dk, dv its block collected around the ring are compared with
// the whole-sequence reference at the rank's positions.
void check_ring(int64_t cp, int64_t chunk, int64_t heads, int64_t kv_heads) {
  SCOPED_TRACE(::testing::Message() << "cp " << cp << ", chunk " << chunk);
  const int64_t seq = 2 * cp * chunk, d = 16, batch = 2;
  const AttentionShape whole{batch, seq, heads, kv_heads, d};
  const AttentionShape local{batch, 2 * chunk, heads, kv_heads, d};
  const Reference r = make_reference(whole, 11);
  const int64_t qw = heads * d, kw = kv_heads * d;
  std::vector<std::vector<float>> k(cp), v(cp), dk(cp), dv(cp);
  for (int64_t rank = 0; rank < cp; ++rank) {
    k[rank] = local_rows(r.k, batch, seq, kw, cp, rank);
    v[rank] = local_rows(r.v, batch, seq, kw, cp, rank);
    dk[rank].assign(k[rank].size(), 0.0f);
    dv[rank].assign(k[rank].size(), 0.0f);
  }
  for (int64_t rank = 0; rank < cp; ++rank) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank);
    const std::vector<float> q = local_rows(r.q, batch, seq, qw, cp, rank);
    const std::vector<float> dout = local_rows(r.dout, batch, seq, qw, cp, rank);
    const std::vector<float> lse = local_stats(r.lse, whole, cp, rank);
    const std::vector<float> delta = local_stats(r.delta, whole, cp, rank);
    RingForwardState state;
    state.reset(local);
    std::vector<float> dq(q.size(), 0.0f);
    for (int64_t step = 0; step < cp; ++step) {  // the ring's order: own block first
      const int64_t owner = (rank - step + cp) % cp;
      const kernels::AttentionLayouts layouts{kernels::cp_layout(cp, rank, chunk),
                                              kernels::cp_layout(cp, owner, chunk)};
      tc_twin_forward_step(local, layouts, q.data(), k[owner].data(), v[owner].data(), state);
      tc_twin_backward_dq(local, layouts, q.data(), dout.data(), lse.data(), delta.data(),
                          k[owner].data(), v[owner].data(), dq.data());
      tc_twin_backward_dkdv(local, layouts, q.data(), dout.data(), lse.data(), delta.data(),
                            k[owner].data(), v[owner].data(), dk[owner].data(), dv[owner].data());
    }
    std::vector<float> out(q.size()), got_lse(lse.size());
    ring_attention_forward_finish(local, state, out.data(), got_lse.data());
    ring_attention_scale(local, static_cast<int64_t>(dq.size()), dq.data());
    expect_within(out, local_rows(r.out, batch, seq, qw, cp, rank),
                  local_rows(r.abs_out, batch, seq, qw, cp, rank), "out");
    expect_lse(got_lse, lse);
    expect_within(dq, local_rows(r.dq, batch, seq, qw, cp, rank),
                  local_rows(r.abs_dq, batch, seq, qw, cp, rank), "dq");
  }
  for (int64_t rank = 0; rank < cp; ++rank) {
    SCOPED_TRACE(::testing::Message() << "dk, dv of rank " << rank << "'s block");
    ring_attention_scale(local, static_cast<int64_t>(dk[rank].size()), dk[rank].data());
    expect_within(dk[rank], local_rows(r.dk, batch, seq, kw, cp, rank),
                  local_rows(r.abs_dk, batch, seq, kw, cp, rank), "dk");
    expect_within(dv[rank], local_rows(r.dv, batch, seq, kw, cp, rank),
                  local_rows(r.abs_dv, batch, seq, kw, cp, rank), "dv");
  }
}

TEST(AttentionTcTwin, RingStepsMatchTheReferenceAtEveryOffset) {
  check_ring(2, 40, 4, 2);  // a 16-row slice holds both chunks (tokens 32..47)
  check_ring(3, 37, 2, 1);  // odd chunks, MQA, three ring offsets
  check_ring(4, 70, 4, 4);  // two key tiles per chunk, one partial
}

// bf16 rounding is to nearest, ties to even, as __float2bfloat16_rn.
TEST(AttentionTcTwin, RoundsToBf16NearestEven) {
  EXPECT_EQ(round_bf16(1.0f + 1.0f / 256.0f), 1.0f);                          // tie: to even
  EXPECT_EQ(round_bf16(1.0f + 3.0f / 256.0f), 1.0f + 4.0f / 256.0f);          // tie: to even (up)
  EXPECT_EQ(round_bf16(1.0f + 1.0f / 256.0f + 1e-6f), 1.0f + 2.0f / 256.0f);  // above the tie
  EXPECT_EQ(round_bf16(-3.0f), -3.0f);
  EXPECT_TRUE(std::isinf(round_bf16(INFINITY)));
  EXPECT_TRUE(std::isnan(round_bf16(NAN)));
}

// The bf16 rounding of P is there (an fp32 P would meet the reference to 1e-6): without it
// the twin would not model the kernels, and the GPU comparison would hide a missing rounding.
TEST(AttentionTcTwin, RoundsPBeforeMultiplyingV) {
  const AttentionShape s{.batch = 1, .seq = 64, .heads = 1, .kv_heads = 1, .head_dim = 16};
  const Reference r = make_reference(s, 3);
  const kernels::TokenLayout causal = kernels::causal_layout(s.seq);
  RingForwardState state;
  state.reset(s);
  tc_twin_forward_step(s, {causal, causal}, r.q.data(), r.k.data(), r.v.data(), state);
  std::vector<float> out(r.out.size()), lse(r.lse.size());
  ring_attention_forward_finish(s, state, out.data(), lse.data());
  double largest = 0.0;
  for (size_t i = 0; i < out.size(); ++i)
    largest = std::max(largest, std::abs(double{out[i]} - r.out[i]));
  EXPECT_GT(largest, 1e-5);
  EXPECT_LT(largest, 4e-3);
}

// tests/gpu/attention_gpu_test.cc holds the CUDA attention to the fp32 CPU backend within
// 2e-3 + 2^-7 relative (out) and 5e-3 + 2^-6 (dq, dk, dv). The kernels now round P and dS
// to bf16; their twin, on that test's very inputs (the same generator and seeds) and with
// bf16 outputs, must meet those bounds, or the GPU test would fail on its first run.
std::vector<float> gpu_test_inputs(int64_t count, uint32_t seed) {  // gpu_test_util.h's
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = round_bf16(distribution(generator));
  return values;
}

void expect_gpu_tolerance(const std::vector<float>& twin, const std::vector<float>& cpu,
                          float abs_tol, float rel_tol, const char* what) {
  ASSERT_EQ(twin.size(), cpu.size());
  for (size_t i = 0; i < twin.size(); ++i) {
    ASSERT_LE(std::abs(round_bf16(twin[i]) - cpu[i]), abs_tol + rel_tol * std::abs(cpu[i]))
        << what << " element " << i;
  }
}

TEST(AttentionTcTwin, MeetsTheGpuTestsToleranceAgainstTheCpuBackend) {
  const AttentionShape s{.batch = 2, .seq = 150, .heads = 4, .kv_heads = 2, .head_dim = 32};
  const int64_t qn = s.batch * s.seq * s.heads * s.head_dim;
  const int64_t kn = s.batch * s.seq * s.kv_heads * s.head_dim;
  const std::vector<float> q = gpu_test_inputs(qn, 21), k = gpu_test_inputs(kn, 22),
                           v = gpu_test_inputs(kn, 23), dout = gpu_test_inputs(qn, 24);
  const kernels::TokenLayout causal = kernels::causal_layout(s.seq);
  RingForwardState state;
  state.reset(s);
  tc_twin_forward_step(s, {causal, causal}, q.data(), k.data(), v.data(), state);
  std::vector<float> out(qn), lse(s.batch * s.heads * s.seq), ref_out(qn), ref_lse(lse.size());
  ring_attention_forward_finish(s, state, out.data(), lse.data());
  attention_forward(s, q.data(), k.data(), v.data(), kernels::kAttentionTileKeys, ref_out.data(),
                    ref_lse.data());
  expect_gpu_tolerance(out, ref_out, 2e-3f, 1.0f / 128, "out");
  // The backward from the (bf16) output on both sides, as the GPU test does.
  for (float& x : out) x = round_bf16(x);
  std::vector<float> delta(lse.size()), dq(qn, 0.0f), dk(kn, 0.0f), dv(kn, 0.0f);
  std::vector<float> ref_dq(qn), ref_dk(kn), ref_dv(kn);
  ring_attention_backward_delta(s, out.data(), dout.data(), delta.data());
  tc_twin_backward_dq(s, {causal, causal}, q.data(), dout.data(), lse.data(), delta.data(),
                      k.data(), v.data(), dq.data());
  tc_twin_backward_dkdv(s, {causal, causal}, q.data(), dout.data(), lse.data(), delta.data(),
                        k.data(), v.data(), dk.data(), dv.data());
  ring_attention_scale(s, qn, dq.data());
  ring_attention_scale(s, kn, dk.data());
  attention_backward(s, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(),
                     ref_dq.data(), ref_dk.data(), ref_dv.data());
  expect_gpu_tolerance(dq, ref_dq, 5e-3f, 1.0f / 64, "dq");
  expect_gpu_tolerance(dk, ref_dk, 5e-3f, 1.0f / 64, "dk");
  expect_gpu_tolerance(dv, ref_dv, 5e-3f, 1.0f / 64, "dv");
}

}  // namespace
}  // namespace dhelix::cpu
