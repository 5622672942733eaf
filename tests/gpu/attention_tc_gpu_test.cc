// The tensor-core attention kernels (runtime/cuda/attention_tc.h) against their host twin
// (runtime/cpu/attention_tc_twin.h), which has the same tiles and the same bf16 roundings
// of P and dS: what may differ is the order of additions inside an mma, CUDA's expf (an
// ulp, which can flip one P's bf16 rounding) and the bf16 outputs (2^-8 relative). Hence
// out to 1e-3 + 2^-7 relative, lse to 1e-5 + 1e-5, gradients to 2e-3 + 2^-6 (docs/kernels.md),
// and for ring steps, whose dq, dk, dv stay bf16 between steps, cp times the gradients'.
// Plain causal attention at head dims 32, 80 (padded to 128) and 128; every rank and ring
// offset of CP 3 with chunks of 37 tokens (a 16-row slice straddles both chunks); the
// backward twice, bit for bit.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "runtime/cpu/attention_tc_twin.h"
#include "runtime/cuda/attention_tc.h"
#include "runtime/cuda/ring_attention_cuda.h"
#include "tests/gpu/gpu_test_util.h"

namespace dhelix::cuda {
namespace {

using testing::bf16_rounded;
using testing::DeviceBuffer;
using testing::expect_close;
using testing::random_floats;
using testing::to_bf16;
using testing::to_f32;

int64_t q_size(const kernels::AttentionShape& s) { return s.batch * s.seq * s.heads * s.head_dim; }
int64_t kv_size(const kernels::AttentionShape& s) {
  return s.batch * s.seq * s.kv_heads * s.head_dim;
}
int64_t stat_size(const kernels::AttentionShape& s) { return s.batch * s.heads * s.seq; }

void check_plain(const kernels::AttentionShape& s) {
  SCOPED_TRACE(::testing::Message() << "seq " << s.seq << ", head_dim " << s.head_dim);
  const std::vector<float> q = bf16_rounded(random_floats(q_size(s), 31));
  const std::vector<float> k = bf16_rounded(random_floats(kv_size(s), 32));
  const std::vector<float> v = bf16_rounded(random_floats(kv_size(s), 33));
  const std::vector<float> dout = bf16_rounded(random_floats(q_size(s), 34));
  const kernels::TokenLayout causal = kernels::causal_layout(s.seq);

  cpu::RingForwardState state;
  state.reset(s);
  cpu::tc_twin_forward_step(s, {causal, causal}, q.data(), k.data(), v.data(), state);
  std::vector<float> out(q_size(s)), lse(stat_size(s));
  cpu::ring_attention_forward_finish(s, state, out.data(), lse.data());

  DeviceBuffer<bf16> d_q(to_bf16(q)), d_k(to_bf16(k)), d_v(to_bf16(v)), d_dout(to_bf16(dout));
  DeviceBuffer<bf16> d_out(q_size(s)), d_dq(q_size(s)), d_dk(kv_size(s)), d_dv(kv_size(s));
  DeviceBuffer<float> d_lse(stat_size(s)), d_delta(stat_size(s));
  attention_forward(s, d_q.get(), d_k.get(), d_v.get(), d_out.get(), d_lse.get(), nullptr);
  const std::vector<float> gpu_out = to_f32(d_out.download());
  expect_close(gpu_out, out, 1e-3f, 1.0f / 128, "out");
  expect_close(d_lse.download(), lse, 1e-5f, 1e-5f, "lse");

  // The backward from the GPU's output and lse on both sides.
  std::vector<float> delta(stat_size(s)), dq(q_size(s)), dk(kv_size(s)), dv(kv_size(s));
  const std::vector<float> gpu_lse = d_lse.download();
  cpu::ring_attention_backward_delta(s, gpu_out.data(), dout.data(), delta.data());
  cpu::tc_twin_backward_dq(s, {causal, causal}, q.data(), dout.data(), gpu_lse.data(), delta.data(),
                           k.data(), v.data(), dq.data());
  cpu::tc_twin_backward_dkdv(s, {causal, causal}, q.data(), dout.data(), gpu_lse.data(),
                             delta.data(), k.data(), v.data(), dk.data(), dv.data());
  cpu::ring_attention_scale(s, q_size(s), dq.data());
  cpu::ring_attention_scale(s, kv_size(s), dk.data());
  attention_backward(s, d_q.get(), d_k.get(), d_v.get(), d_out.get(), d_lse.get(), d_dout.get(),
                     d_dq.get(), d_dk.get(), d_dv.get(), d_delta.get(), nullptr);
  expect_close(d_delta.download(), delta, 1e-5f, 1e-5f, "delta");
  const std::vector<float> gpu_dq = to_f32(d_dq.download()), gpu_dk = to_f32(d_dk.download());
  expect_close(gpu_dq, dq, 2e-3f, 1.0f / 64, "dq");
  expect_close(gpu_dk, dk, 2e-3f, 1.0f / 64, "dk");
  expect_close(to_f32(d_dv.download()), dv, 2e-3f, 1.0f / 64, "dv");

  // Deterministic: the same inputs give the same bits (no atomics, fixed reduction order).
  attention_backward(s, d_q.get(), d_k.get(), d_v.get(), d_out.get(), d_lse.get(), d_dout.get(),
                     d_dq.get(), d_dk.get(), d_dv.get(), d_delta.get(), nullptr);
  EXPECT_EQ(to_f32(d_dq.download()), gpu_dq);
  EXPECT_EQ(to_f32(d_dk.download()), gpu_dk);
}

TEST(CudaTcAttention, PlainCausalMatchesTheTwin) {
  DHELIX_REQUIRE_GPUS(1);
  check_plain({.batch = 2, .seq = 150, .heads = 4, .kv_heads = 2, .head_dim = 32});
  check_plain({.batch = 1, .seq = 97, .heads = 8, .kv_heads = 1, .head_dim = 80});
  check_plain({.batch = 1, .seq = 300, .heads = 4, .kv_heads = 4, .head_dim = 128});
}

TEST(CudaTcAttention, RingStepsMatchTheTwinAtEveryOffset) {
  DHELIX_REQUIRE_GPUS(1);
  constexpr int64_t kCp = 3, kChunk = 37;
  const kernels::AttentionShape s{
      .batch = 2, .seq = 2 * kChunk, .heads = 4, .kv_heads = 2, .head_dim = 64};
  std::vector<std::vector<float>> k, v;
  for (int64_t r = 0; r < kCp; ++r) {
    k.push_back(bf16_rounded(random_floats(kv_size(s), 40 + r)));
    v.push_back(bf16_rounded(random_floats(kv_size(s), 50 + r)));
  }
  for (int64_t rank = 0; rank < kCp; ++rank) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank);
    const std::vector<float> q = bf16_rounded(random_floats(q_size(s), 60 + rank));
    const std::vector<float> dout = bf16_rounded(random_floats(q_size(s), 70 + rank));
    DeviceBuffer<bf16> d_q(to_bf16(q)), d_dout(to_bf16(dout)), d_out(q_size(s));
    DeviceBuffer<float> stats(ring_state_stats_elements(s)), acc(ring_state_acc_elements(s));
    DeviceBuffer<float> d_lse(stat_size(s)), d_delta(stat_size(s));
    const RingDeviceState state{.stats = stats.get(), .acc = acc.get()};
    cpu::RingForwardState cpu_state;
    cpu_state.reset(s);
    ring_forward_start(s, state, nullptr);
    for (int64_t step = 0; step < kCp; ++step) {
      const int64_t owner = (rank - step + kCp) % kCp;
      DeviceBuffer<bf16> d_k(to_bf16(k[owner])), d_v(to_bf16(v[owner]));
      ring_forward_step(s, {.cp = kCp, .rank = rank, .block_rank = owner, .chunk = kChunk},
                        d_q.get(), d_k.get(), d_v.get(), state, nullptr);
      cpu::tc_twin_forward_step(
          s, {kernels::cp_layout(kCp, rank, kChunk), kernels::cp_layout(kCp, owner, kChunk)},
          q.data(), k[owner].data(), v[owner].data(), cpu_state);
    }
    std::vector<float> out(q_size(s)), lse(stat_size(s));
    cpu::ring_attention_forward_finish(s, cpu_state, out.data(), lse.data());
    ring_forward_finish(s, state, d_out.get(), d_lse.get(), nullptr);
    const std::vector<float> gpu_out = to_f32(d_out.download());
    expect_close(gpu_out, out, 1e-3f, 1.0f / 128, "out");
    expect_close(d_lse.download(), lse, 1e-5f, 1e-5f, "lse");

    // Backward: each step's dq and dk/dv share, from the GPU's output and lse.
    const std::vector<float> gpu_lse = d_lse.download();
    std::vector<float> delta(stat_size(s)), dq(q_size(s), 0.0f);
    cpu::ring_attention_backward_delta(s, gpu_out.data(), dout.data(), delta.data());
    ring_backward_delta(s, d_out.get(), d_dout.get(), d_delta.get(), nullptr);
    DeviceBuffer<bf16> d_dq(to_bf16(dq));
    for (int64_t step = 0; step < kCp; ++step) {
      const int64_t owner = (rank - step + kCp) % kCp;
      std::vector<float> dk(kv_size(s), 0.0f), dv(kv_size(s), 0.0f);
      DeviceBuffer<bf16> d_k(to_bf16(k[owner])), d_v(to_bf16(v[owner]));
      DeviceBuffer<bf16> d_dk(to_bf16(dk)), d_dv(to_bf16(dv));
      const kernels::AttentionLayouts layouts{kernels::cp_layout(kCp, rank, kChunk),
                                              kernels::cp_layout(kCp, owner, kChunk)};
      cpu::tc_twin_backward_dq(s, layouts, q.data(), dout.data(), gpu_lse.data(), delta.data(),
                               k[owner].data(), v[owner].data(), dq.data());
      cpu::tc_twin_backward_dkdv(s, layouts, q.data(), dout.data(), gpu_lse.data(), delta.data(),
                                 k[owner].data(), v[owner].data(), dk.data(), dv.data());
      ring_backward_step(s, {.cp = kCp, .rank = rank, .block_rank = owner, .chunk = kChunk},
                         d_q.get(), d_dout.get(), d_lse.get(), d_delta.get(), d_k.get(), d_v.get(),
                         d_dq.get(), d_dk.get(), d_dv.get(), nullptr);
      expect_close(to_f32(d_dk.download()), dk, 2e-3f, 1.0f / 64, "dk share");
      expect_close(to_f32(d_dv.download()), dv, 2e-3f, 1.0f / 64, "dv share");
    }
    expect_close(to_f32(d_dq.download()), dq, kCp * 2e-3f, kCp / 64.0f, "dq (unscaled)");
  }
}

}  // namespace
}  // namespace dhelix::cuda
