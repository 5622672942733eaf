// The CUDA ring attention of context parallelism (runtime/cuda/ring_attention_cuda.h)
// against the CPU backend's (runtime/cpu/ring_attention_cpu.h) on bf16-rounded inputs:
// every rank of a CP group simulated on one GPU, every ring step in the ring's order, the
// forward's merged output and lse, the backward's dq and each step's dk/dv share, with the
// tolerances of attention_gpu_test.cc (docs/kernels.md: bf16 outputs, fp32 sums). Chunks of
// 70 tokens: two key tiles per chunk, a partial one included, and the causal edge inside a
// chunk the rank both holds and visits.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "runtime/cpu/ring_attention_cpu.h"
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

constexpr int64_t kChunk = 70;
const kernels::AttentionShape kShape{
    .batch = 2, .seq = 2 * kChunk, .heads = 4, .kv_heads = 2, .head_dim = 32};

int64_t q_size() { return kShape.batch * kShape.seq * kShape.heads * kShape.head_dim; }
int64_t kv_size() { return kShape.batch * kShape.seq * kShape.kv_heads * kShape.head_dim; }
int64_t stat_size() { return kShape.batch * kShape.heads * kShape.seq; }

cpu::RingStep step_of(int64_t cp, int64_t rank, int64_t s) {
  return {.cp = cp, .rank = rank, .block_rank = (rank - s % cp + cp) % cp, .chunk = kChunk};
}

// One CP rank's forward and backward on both backends, its peers' K/V blocks given.
void check_rank(int64_t cp, int64_t rank, const std::vector<std::vector<float>>& k,
                const std::vector<std::vector<float>>& v) {
  SCOPED_TRACE(::testing::Message() << "cp " << cp << ", rank " << rank);
  const std::vector<float> q = bf16_rounded(random_floats(q_size(), 100 + rank));
  const std::vector<float> dout = bf16_rounded(random_floats(q_size(), 200 + rank));
  DeviceBuffer<bf16> d_q(to_bf16(q)), d_dout(to_bf16(dout)), d_out(q_size()), d_dq(q_size());
  DeviceBuffer<float> d_lse(stat_size()), d_delta(stat_size());
  DeviceBuffer<float> stats(ring_state_stats_elements(kShape)),
      acc(ring_state_acc_elements(kShape));
  std::vector<std::unique_ptr<DeviceBuffer<bf16>>> d_k, d_v;
  for (int64_t b = 0; b < cp; ++b) {
    d_k.push_back(std::make_unique<DeviceBuffer<bf16>>(to_bf16(k[static_cast<size_t>(b)])));
    d_v.push_back(std::make_unique<DeviceBuffer<bf16>>(to_bf16(v[static_cast<size_t>(b)])));
  }
  const RingDeviceState state{.stats = stats.get(), .acc = acc.get()};

  // Forward.
  cpu::RingForwardState cpu_state;
  cpu_state.reset(kShape);
  ring_forward_start(kShape, state, nullptr);
  for (int64_t s = 0; s < cp; ++s) {
    const cpu::RingStep step = step_of(cp, rank, s);
    const auto block = static_cast<size_t>(step.block_rank);
    cpu::ring_attention_forward_step(kShape, step, q.data(), k[block].data(), v[block].data(),
                                     cpu_state);
    ring_forward_step(kShape, step, d_q.get(), d_k[block]->get(), d_v[block]->get(), state,
                      nullptr);
  }
  std::vector<float> out(q_size()), lse(stat_size());
  cpu::ring_attention_forward_finish(kShape, cpu_state, out.data(), lse.data());
  ring_forward_finish(kShape, state, d_out.get(), d_lse.get(), nullptr);
  const std::vector<float> gpu_out = to_f32(d_out.download());
  expect_close(gpu_out, out, 2e-3f, 1.0f / 128, "out");
  expect_close(d_lse.download(), lse, 1e-5f, 1e-5f, "lse");

  // Backward from the GPU's own output on both sides; the shares start at zero per step.
  std::vector<float> delta(stat_size()), dq(q_size(), 0.0f);
  cpu::ring_attention_backward_delta(kShape, gpu_out.data(), dout.data(), delta.data());
  ring_backward_delta(kShape, d_out.get(), d_dout.get(), d_delta.get(), nullptr);
  expect_close(d_delta.download(), delta, 1e-4f, 1e-4f, "delta");
  DHELIX_CUDA(cudaMemset(d_dq.get(), 0, static_cast<size_t>(q_size()) * sizeof(bf16)));
  for (int64_t s = 0; s < cp; ++s) {
    const cpu::RingStep step = step_of(cp, rank, s);
    const auto block = static_cast<size_t>(step.block_rank);
    std::vector<float> dk(kv_size(), 0.0f), dv(kv_size(), 0.0f);
    cpu::ring_attention_backward_step(kShape, step, q.data(), dout.data(), lse.data(), delta.data(),
                                      k[block].data(), v[block].data(), dq.data(), dk.data(),
                                      dv.data());
    DeviceBuffer<bf16> d_dk(to_bf16(std::vector<float>(kv_size(), 0.0f)));
    DeviceBuffer<bf16> d_dv(to_bf16(std::vector<float>(kv_size(), 0.0f)));
    ring_backward_step(kShape, step, d_q.get(), d_dout.get(), d_lse.get(), d_delta.get(),
                       d_k[block]->get(), d_v[block]->get(), d_dq.get(), d_dk.get(), d_dv.get(),
                       nullptr);
    expect_close(to_f32(d_dk.download()), dk, 5e-3f, 1.0f / 64, "dk share");
    expect_close(to_f32(d_dv.download()), dv, 5e-3f, 1.0f / 64, "dv share");
  }
  // dq carries one bf16 rounding per step (ring_attention_cuda.h): cp of them.
  expect_close(to_f32(d_dq.download()), dq, 5e-3f * static_cast<float>(cp),
               static_cast<float>(cp) / 64, "dq");
}

TEST(CudaRingAttention, EveryRankAndStepMatchesTheCpu) {
  DHELIX_REQUIRE_GPUS(1);
  for (int64_t cp : {2, 3}) {
    std::vector<std::vector<float>> k, v;
    for (int64_t b = 0; b < cp; ++b) {
      k.push_back(bf16_rounded(random_floats(kv_size(), 10 + static_cast<uint32_t>(b))));
      v.push_back(bf16_rounded(random_floats(kv_size(), 20 + static_cast<uint32_t>(b))));
    }
    for (int64_t rank = 0; rank < cp; ++rank) check_rank(cp, rank, k, v);
  }
}

TEST(CudaRingAttention, SameInputGivesTheSameBits) {
  DHELIX_REQUIRE_GPUS(1);
  DeviceBuffer<bf16> q(to_bf16(random_floats(q_size(), 1))),
      k(to_bf16(random_floats(kv_size(), 2))), v(to_bf16(random_floats(kv_size(), 3)));
  std::vector<std::vector<float>> outs;
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer<float> stats(ring_state_stats_elements(kShape)),
        acc(ring_state_acc_elements(kShape)), lse(stat_size());
    DeviceBuffer<bf16> out(q_size());
    const RingDeviceState state{.stats = stats.get(), .acc = acc.get()};
    ring_forward_start(kShape, state, nullptr);
    ring_forward_step(kShape, step_of(2, 1, 0), q.get(), k.get(), v.get(), state, nullptr);
    ring_forward_step(kShape, step_of(2, 1, 1), q.get(), k.get(), v.get(), state, nullptr);
    ring_forward_finish(kShape, state, out.get(), lse.get(), nullptr);
    outs.push_back(to_f32(out.download()));
  }
  EXPECT_EQ(outs[0], outs[1]);
}

TEST(CudaRingAttention, ScaleMultipliesInFp32AndRoundsOnce) {
  DHELIX_REQUIRE_GPUS(1);
  const std::vector<float> values = bf16_rounded(random_floats(1000, 5));
  DeviceBuffer<bf16> d(to_bf16(values));
  scale_tensor(1000, 0.125f, d.get(), nullptr);
  std::vector<float> expected(values.size());
  for (size_t i = 0; i < values.size(); ++i) expected[i] = values[i] * 0.125f;  // exact
  EXPECT_EQ(to_f32(d.download()), expected);
}

}  // namespace
}  // namespace dhelix::cuda
