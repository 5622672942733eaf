// Each CUDA row/element kernel against the CPU backend's function on the same (bf16-rounded)
// inputs. Tolerances: a bf16 output is within 2^-8 relative of the fp32 value; fp32
// outputs (statistics, gradients of weights) differ only by fused multiply-adds and expf.
#include <gtest/gtest.h>

#include <cmath>
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

constexpr float kBf16Rel = 1.0f / 128;

TEST(CudaKernels, ResidualAddAndConversions) {
  DHELIX_REQUIRE_GPUS(1);
  const int64_t n = 1000;
  const std::vector<float> a = bf16_rounded(random_floats(n, 1));
  const std::vector<float> b = bf16_rounded(random_floats(n, 2));
  DeviceBuffer<bf16> da(to_bf16(a)), db(to_bf16(b)), out(n);
  add_tensors(n, da.get(), db.get(), out.get(), nullptr);
  std::vector<float> expected(n);
  cpu::add_tensors(n, a.data(), b.data(), expected.data());
  expect_close(to_f32(out.download()), expected, 0.0f, kBf16Rel, "add");
  DeviceBuffer<float> f(a), back(n);
  DeviceBuffer<bf16> half(n);
  convert_to_bf16(n, f.get(), half.get(), nullptr);
  convert_to_f32(n, half.get(), back.get(), nullptr);
  EXPECT_EQ(back.download(), a);  // a is already bf16-representable: exact round trip
}

TEST(CudaKernels, RmsNormForwardAndBackward) {
  DHELIX_REQUIRE_GPUS(1);
  const int64_t rows = 37, dim = 300;
  const std::vector<float> x = bf16_rounded(random_floats(rows * dim, 3));
  const std::vector<float> dy = bf16_rounded(random_floats(rows * dim, 4));
  const std::vector<float> gain = random_floats(dim, 5, 0.5f, 1.5f);
  std::vector<float> y(rows * dim), rstd(rows), dx(rows * dim), dgain(dim, 0.25f);
  cpu::rmsnorm_forward(rows, dim, x.data(), gain.data(), 1e-5f, y.data(), rstd.data());
  cpu::rmsnorm_backward(rows, dim, x.data(), gain.data(), rstd.data(), dy.data(), dx.data(),
                        dgain.data());
  DeviceBuffer<bf16> d_x(to_bf16(x)), d_dy(to_bf16(dy)), d_y(rows * dim), d_dx(rows * dim);
  DeviceBuffer<float> d_gain(gain), d_rstd(rows), d_dgain(std::vector<float>(dim, 0.25f));
  rmsnorm_forward(rows, dim, d_x.get(), d_gain.get(), 1e-5f, d_y.get(), d_rstd.get(), nullptr);
  DeviceBuffer<char> scratch(column_reduction_workspace_bytes(rows, dim));
  rmsnorm_backward(rows, dim, d_x.get(), d_gain.get(), d_rstd.get(), d_dy.get(), d_dx.get(),
                   d_dgain.get(), {scratch.get(), column_reduction_workspace_bytes(rows, dim)},
                   nullptr);
  expect_close(d_rstd.download(), rstd, 0.0f, 1e-5f, "rstd");
  expect_close(to_f32(d_y.download()), y, 1e-6f, kBf16Rel, "y");
  expect_close(to_f32(d_dx.download()), dx, 1e-3f, kBf16Rel, "dx");
  expect_close(d_dgain.download(), dgain, 1e-4f, 1e-4f, "dgain");
}

TEST(CudaKernels, RopeForwardAndBackward) {
  DHELIX_REQUIRE_GPUS(1);
  const int64_t batch = 2, seq = 9, heads = 3, head_dim = 16, offset = 4;
  const cpu::RopeTable table = cpu::make_rope_table(16, head_dim, 10000.0);
  DeviceBuffer<float> cos_table(table.cos), sin_table(table.sin);
  const DeviceRopeTable device_table{cos_table.get(), sin_table.get(), 16, head_dim};
  const std::vector<float> x = bf16_rounded(random_floats(batch * seq * heads * head_dim, 6));
  std::vector<float> expected = x;
  cpu::rope_forward(table, batch, seq, heads, offset, expected.data());
  DeviceBuffer<bf16> d_x(to_bf16(x));
  rope_forward(device_table, batch, seq, heads, offset, d_x.get(), nullptr);
  expect_close(to_f32(d_x.download()), expected, 1e-6f, kBf16Rel, "rope forward");
  std::vector<float> back = x;
  cpu::rope_backward(table, batch, seq, heads, offset, back.data());
  DeviceBuffer<bf16> d_dy(to_bf16(x));
  rope_backward(device_table, batch, seq, heads, offset, d_dy.get(), nullptr);
  expect_close(to_f32(d_dy.download()), back, 1e-6f, kBf16Rel, "rope backward");
}

TEST(CudaKernels, SwiGluForwardAndBackward) {
  DHELIX_REQUIRE_GPUS(1);
  const int64_t rows = 11, ffn = 70;
  const std::vector<float> gate_up = bf16_rounded(random_floats(rows * 2 * ffn, 7, -4.0f, 4.0f));
  const std::vector<float> dout = bf16_rounded(random_floats(rows * ffn, 8));
  std::vector<float> out(rows * ffn), d_gate_up(rows * 2 * ffn);
  cpu::swiglu_forward(rows, ffn, gate_up.data(), out.data());
  cpu::swiglu_backward(rows, ffn, gate_up.data(), dout.data(), d_gate_up.data());
  DeviceBuffer<bf16> d_in(to_bf16(gate_up)), d_dout(to_bf16(dout)), d_out(rows * ffn),
      d_grad(rows * 2 * ffn);
  swiglu_forward(rows, ffn, d_in.get(), d_out.get(), nullptr);
  swiglu_backward(rows, ffn, d_in.get(), d_dout.get(), d_grad.get(), nullptr);
  expect_close(to_f32(d_out.download()), out, 1e-6f, kBf16Rel, "swiglu out");
  expect_close(to_f32(d_grad.download()), d_gate_up, 1e-6f, kBf16Rel, "swiglu grad");
}

TEST(CudaKernels, VocabParallelCrossEntropyOverTwoShards) {
  DHELIX_REQUIRE_GPUS(1);
  const int64_t rows = 13, width = 50, shards = 2;
  const std::vector<float> logits = bf16_rounded(random_floats(rows * width * shards, 9, -3, 3));
  std::vector<int64_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = (r * 37) % (width * shards);
  targets[3] = -1;  // ignored
  DeviceBuffer<int64_t> d_targets(targets);
  std::vector<float> stats(shards * rows * 3), gpu_stats(shards * rows * 3);
  std::vector<float> shard_logits[2];
  for (int64_t s = 0; s < shards; ++s) {
    shard_logits[s].resize(rows * width);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < width; ++j) {
        shard_logits[s][r * width + j] = logits[r * width * shards + s * width + j];
      }
    }
    cpu::vocab_parallel_stats(rows, width, s * width, shard_logits[s].data(), targets.data(),
                              stats.data() + s * rows * 3);
    DeviceBuffer<bf16> d_logits(to_bf16(shard_logits[s]));
    DeviceBuffer<float> d_stats(rows * 3);
    vocab_parallel_stats(rows, width, s * width, d_logits.get(), d_targets.get(), d_stats.get(),
                         nullptr);
    const std::vector<float> part = d_stats.download();
    std::copy(part.begin(), part.end(), gpu_stats.begin() + s * rows * 3);
  }
  expect_close(gpu_stats, stats, 1e-6f, 1e-5f, "stats");
  std::vector<float> lse(rows), loss(rows);
  cpu::vocab_parallel_combine(rows, shards, width, stats.data(), targets.data(), lse.data(),
                              loss.data());
  DeviceBuffer<float> d_all(stats), d_lse(rows), d_loss(rows);
  vocab_parallel_combine(rows, shards, width, d_all.get(), d_targets.get(), d_lse.get(),
                         d_loss.get(), nullptr);
  expect_close(d_lse.download(), lse, 1e-6f, 1e-5f, "lse");
  expect_close(d_loss.download(), loss, 1e-5f, 1e-5f, "loss");
  std::vector<float> dlogits(rows * width);
  cpu::vocab_parallel_backward(rows, width, width, shard_logits[1].data(), targets.data(),
                               lse.data(), 0.5f, dlogits.data());
  DeviceBuffer<bf16> d_shard(to_bf16(shard_logits[1])), d_dlogits(rows * width);
  vocab_parallel_backward(rows, width, width, d_shard.get(), d_targets.get(), d_lse.get(), 0.5f,
                          d_dlogits.get(), nullptr);
  expect_close(to_f32(d_dlogits.download()), dlogits, 1e-6f, kBf16Rel, "dlogits");
}

TEST(CudaKernels, EmbeddingForwardAndBackwardOnAShard) {
  DHELIX_REQUIRE_GPUS(1);
  const int64_t positions = 40, dim = 24, vocab_begin = 10, vocab_local = 10;
  std::vector<int64_t> tokens(positions);
  for (int64_t r = 0; r < positions; ++r) tokens[r] = (r * 7) % 30;  // repeats, other shards
  const std::vector<float> table = bf16_rounded(random_floats(vocab_local * dim, 10));
  const std::vector<float> dout = bf16_rounded(random_floats(positions * dim, 11));
  std::vector<float> out(positions * dim), dtable(vocab_local * dim, 1.0f);
  cpu::embedding_forward(positions, dim, tokens.data(), table.data(), vocab_begin, vocab_local,
                         out.data());
  cpu::embedding_backward(positions, dim, tokens.data(), dout.data(), vocab_begin, vocab_local,
                          dtable.data());
  DeviceBuffer<int64_t> d_tokens(tokens);
  DeviceBuffer<bf16> d_table(to_bf16(table)), d_out(positions * dim), d_dout(to_bf16(dout));
  DeviceBuffer<float> d_dtable(std::vector<float>(vocab_local * dim, 1.0f));
  embedding_forward(positions, dim, d_tokens.get(), d_table.get(), vocab_begin, vocab_local,
                    d_out.get(), nullptr);
  DeviceBuffer<char> scratch(embedding_backward_workspace_bytes(positions));
  embedding_backward(positions, dim, d_tokens.get(), d_dout.get(), vocab_begin, vocab_local,
                     d_dtable.get(), {scratch.get(), embedding_backward_workspace_bytes(positions)},
                     nullptr);
  EXPECT_EQ(to_f32(d_out.download()), out);  // a gather: exact
  EXPECT_EQ(d_dtable.download(), dtable);    // same additions in the same order
}

TEST(CudaKernels, AdamWUpdatesMasterAndWritesBf16Copy) {
  DHELIX_REQUIRE_GPUS(1);
  const int64_t n = 777;
  const kernels::AdamWStep step = kernels::make_adamw_step(3, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f);
  const std::vector<float> grads = random_floats(n, 12);
  std::vector<float> params = random_floats(n, 13), m = random_floats(n, 14, -0.1f, 0.1f),
                     v = random_floats(n, 15, 0.0f, 0.01f);
  DeviceBuffer<float> d_g(grads), d_p(params), d_m(m), d_v(v);
  DeviceBuffer<bf16> d_copy(n);
  adamw_update(step, n, d_g.get(), d_p.get(), d_m.get(), d_v.get(), d_copy.get(), nullptr);
  cpu::adamw_update(step, n, grads.data(), params.data(), m.data(), v.data());
  expect_close(d_p.download(), params, 1e-6f, 1e-5f, "params");
  expect_close(d_m.download(), m, 1e-7f, 1e-5f, "m");
  expect_close(d_v.download(), v, 1e-9f, 1e-5f, "v");
  EXPECT_EQ(to_f32(d_copy.download()), bf16_rounded(d_p.download()));
}

TEST(CudaKernels, DelayHoldsTheStream) {
  DHELIX_REQUIRE_GPUS(1);
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, end = nullptr;
  DHELIX_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DHELIX_CUDA(cudaEventCreate(&start));
  DHELIX_CUDA(cudaEventCreate(&end));
  DHELIX_CUDA(cudaEventRecord(start, stream));
  delay(2000, stream);
  DHELIX_CUDA(cudaEventRecord(end, stream));
  DHELIX_CUDA(cudaEventSynchronize(end));
  float elapsed_ms = 0;
  DHELIX_CUDA(cudaEventElapsedTime(&elapsed_ms, start, end));
  EXPECT_GE(elapsed_ms, 1.9f);  // event resolution is about half a microsecond
  EXPECT_LT(elapsed_ms, 50.0f);
  static_cast<void>(cudaEventDestroy(start));
  static_cast<void>(cudaEventDestroy(end));
  static_cast<void>(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace dhelix::cuda
