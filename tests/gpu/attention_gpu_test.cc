// The CUDA flash attention against the CPU backend's on bf16-rounded inputs, GQA with a
// sequence longer than one tile (so that tiles, partial tiles and the causal edge all run).
#include <gtest/gtest.h>

#include <vector>

#include "runtime/cpu/kernels_cpu.h"
#include "runtime/cuda/kernels_cuda.h"
#include "tests/gpu/gpu_test_util.h"

namespace dhelix::cuda {
namespace {

using testing::bf16_rounded;
using testing::DeviceBuffer;
using testing::expect_close;
using testing::random_floats;
using testing::to_bf16;
using testing::to_f32;

TEST(CudaAttention, ForwardAndBackwardMatchTheCpu) {
  DHELIX_REQUIRE_GPUS(1);
  const kernels::AttentionShape shape{
      .batch = 2, .seq = 150, .heads = 4, .kv_heads = 2, .head_dim = 32};
  const int64_t q_size = shape.batch * shape.seq * shape.heads * shape.head_dim;
  const int64_t kv_size = shape.batch * shape.seq * shape.kv_heads * shape.head_dim;
  const int64_t stat_size = shape.batch * shape.heads * shape.seq;
  const std::vector<float> q = bf16_rounded(random_floats(q_size, 21));
  const std::vector<float> k = bf16_rounded(random_floats(kv_size, 22));
  const std::vector<float> v = bf16_rounded(random_floats(kv_size, 23));
  const std::vector<float> dout = bf16_rounded(random_floats(q_size, 24));
  std::vector<float> out(q_size), lse(stat_size), dq(q_size), dk(kv_size), dv(kv_size);
  cpu::attention_forward(shape, q.data(), k.data(), v.data(), kernels::kAttentionTileKeys,
                         out.data(), lse.data());

  DeviceBuffer<bf16> d_q(to_bf16(q)), d_k(to_bf16(k)), d_v(to_bf16(v)), d_dout(to_bf16(dout));
  DeviceBuffer<bf16> d_out(q_size), d_dq(q_size), d_dk(kv_size), d_dv(kv_size);
  DeviceBuffer<float> d_lse(stat_size), d_delta(stat_size);
  attention_forward(shape, d_q.get(), d_k.get(), d_v.get(), d_out.get(), d_lse.get(), nullptr);
  const std::vector<float> gpu_out = to_f32(d_out.download());
  expect_close(gpu_out, out, 2e-3f, 1.0f / 128, "out");
  expect_close(d_lse.download(), lse, 1e-5f, 1e-5f, "lse");

  // The backward from the GPU's own (bf16) output, on both sides.
  cpu::attention_backward(shape, q.data(), k.data(), v.data(), gpu_out.data(), lse.data(),
                          dout.data(), dq.data(), dk.data(), dv.data());
  attention_backward(shape, d_q.get(), d_k.get(), d_v.get(), d_out.get(), d_lse.get(), d_dout.get(),
                     d_dq.get(), d_dk.get(), d_dv.get(), d_delta.get(), nullptr);
  expect_close(to_f32(d_dq.download()), dq, 5e-3f, 1.0f / 64, "dq");
  expect_close(to_f32(d_dk.download()), dk, 5e-3f, 1.0f / 64, "dk");
  expect_close(to_f32(d_dv.download()), dv, 5e-3f, 1.0f / 64, "dv");
}

TEST(CudaAttention, SameInputGivesTheSameBits) {
  DHELIX_REQUIRE_GPUS(1);
  const kernels::AttentionShape shape{
      .batch = 1, .seq = 70, .heads = 2, .kv_heads = 1, .head_dim = 16};
  const int64_t size = shape.seq * shape.heads * shape.head_dim;
  const int64_t kv = shape.seq * shape.head_dim;
  DeviceBuffer<bf16> q(to_bf16(random_floats(size, 1))), k(to_bf16(random_floats(kv, 2))),
      v(to_bf16(random_floats(kv, 3))), out1(size), out2(size);
  DeviceBuffer<float> lse1(shape.heads * shape.seq), lse2(shape.heads * shape.seq);
  attention_forward(shape, q.get(), k.get(), v.get(), out1.get(), lse1.get(), nullptr);
  attention_forward(shape, q.get(), k.get(), v.get(), out2.get(), lse2.get(), nullptr);
  EXPECT_EQ(to_f32(out1.download()), to_f32(out2.download()));
  EXPECT_EQ(lse1.download(), lse2.download());
}

}  // namespace
}  // namespace dhelix::cuda
