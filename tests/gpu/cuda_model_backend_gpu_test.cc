// CudaBackend (runtime/cuda/cuda_model_backend.h) against CpuBackend, wrapper by wrapper, on
// the same bf16-rounded inputs, with every buffer from CudaBackend::Memory.
//
// Tolerances. bf16 keeps 8 significant bits, so rounding an fp32 result to bf16 (nearest
// even) moves it by at most 2^-9 relative; the CPU's fp32 result and the GPU's fp32
// intermediate differ slightly (fused multiply-adds, summation order, CUDA's expf), which
// can put them on opposite sides of a bf16 rounding boundary: one bf16 step, 2^-8 relative,
// apart. kBf16Rel = 2^-7 covers that with a factor 2 to spare; outputs near zero get an
// absolute term instead (a relative bound is meaningless there). GEMM outputs accumulate
// tens of products of values in [-1, 1): their absolute term is 1e-3. fp32 outputs
// (statistics, weight gradients) differ only by the fp32 effects above: 1e-5 relative.
// Copies (split, merge, embedding gather, compute copies, uploads) are exact.
#include "runtime/cuda/cuda_model_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/cuda/cublas_gemm.h"
#include "runtime/cuda/device_pool.h"
#include "runtime/model/cpu_backend.h"
#include "tests/gpu/gpu_test_util.h"

namespace dhelix::cuda {
namespace {

using rt::CpuBackend;
using testing::bf16_rounded;
using testing::DeviceBuffer;
using testing::expect_close;
using testing::random_floats;
using testing::to_bf16;
using testing::to_f32;
using bf16 = CudaBackend::Act;

constexpr float kBf16Rel = 1.0f / 128;

// ---- Host side: the strided copies of split_qkv / merge_qkv ---------------------------

TEST(QkvCopyPlan, ColumnBlocksOfTheFusedRowInBytes) {
  // q_width 8, kv_width 2: a fused row is 12 bf16 = 24 bytes; q at 0 (16 bytes), k at 16
  // (4 bytes), v at 20 (4 bytes).
  const QkvCopyPlan plan = qkv_copy_plan(5, 8, 2);
  EXPECT_EQ(plan.rows, 5);
  EXPECT_EQ(plan.blocks[0], (QkvBlockCopy{0, 16, 24}));
  EXPECT_EQ(plan.blocks[1], (QkvBlockCopy{16, 4, 24}));
  EXPECT_EQ(plan.blocks[2], (QkvBlockCopy{20, 4, 24}));
}

TEST(QkvCopyPlan, WithoutKeysAndValuesOnlyTheQueryBlockHasWidth) {
  const QkvCopyPlan plan = qkv_copy_plan(0, 3, 0);
  EXPECT_EQ(plan.rows, 0);
  EXPECT_EQ(plan.blocks[0], (QkvBlockCopy{0, 6, 6}));
  EXPECT_EQ(plan.blocks[1], (QkvBlockCopy{6, 0, 6}));
  EXPECT_EQ(plan.blocks[2], (QkvBlockCopy{6, 0, 6}));
}

// Misconfigurations caught before anything reaches the device.
TEST(CudaBackendDeathTest, GemmWithoutAHandleAborts) {
  EXPECT_DEATH(CudaBackend::linear_forward(CudaBackend::Exec{}, 1, 1, 1, nullptr, nullptr, nullptr),
               "check failed: exec.gemm != nullptr");
}

TEST(CudaBackendDeathTest, MemoryWithoutAPoolAborts) {
  EXPECT_DEATH(CudaBackend::Memory(CudaBackend::MemoryConfig{}), "check failed: pool_ != nullptr");
}

// ---- Device ----------------------------------------------------------------------------

// One stream runs both the pool's work and the ops, so a stream synchronisation before a
// download covers everything enqueued.
class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DHELIX_REQUIRE_GPUS(1);
    DHELIX_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    pool_ = std::make_unique<cuda::DevicePool>(stream_, int64_t{1} << 20);
    gemm_ = std::make_unique<cuda::CublasGemm>(stream_);
    memory_ = std::make_unique<CudaBackend::Memory>(CudaBackend::MemoryConfig{pool_.get()});
    workspace_ = std::make_unique<DeviceBuffer<char>>(kWorkspaceBytes);
    exec_ = CudaBackend::Exec{stream_, gemm_.get(), {workspace_->get(), kWorkspaceBytes}};
  }
  void TearDown() override {
    if (stream_ == nullptr) return;
    DHELIX_CUDA(cudaStreamSynchronize(stream_));
    memory_.reset();
    workspace_.reset();
    gemm_.reset();
    pool_.reset();
    static_cast<void>(cudaStreamDestroy(stream_));
  }

  /// values (already bf16-representable) as a device bf16 buffer.
  bf16* device_bf16(const std::vector<float>& values) {
    const std::vector<bf16> host = to_bf16(values);
    bf16* buffer = memory_->allocate<bf16>(static_cast<int64_t>(host.size()));
    memory_->upload(host.data(), buffer, static_cast<int64_t>(host.size()));
    return buffer;
  }
  template <class T>
  T* device(const std::vector<T>& values) {
    T* buffer = memory_->allocate<T>(static_cast<int64_t>(values.size()));
    memory_->upload(values.data(), buffer, static_cast<int64_t>(values.size()));
    return buffer;
  }
  /// The buffer's contents once the stream has finished, as fp32.
  std::vector<float> host_f32(const bf16* buffer, int64_t count) {
    DHELIX_CUDA(cudaStreamSynchronize(stream_));
    std::vector<bf16> host(static_cast<size_t>(count));
    memory_->download(buffer, host.data(), count);
    return to_f32(host);
  }
  std::vector<float> host_f32(const float* buffer, int64_t count) {
    DHELIX_CUDA(cudaStreamSynchronize(stream_));
    std::vector<float> host(static_cast<size_t>(count));
    memory_->download(buffer, host.data(), count);
    return host;
  }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::DevicePool> pool_;
  std::unique_ptr<cuda::CublasGemm> gemm_;
  std::unique_ptr<CudaBackend::Memory> memory_;
  static constexpr int64_t kWorkspaceBytes = int64_t{1} << 20;
  std::unique_ptr<DeviceBuffer<char>> workspace_;
  CudaBackend::Exec exec_;
  const CpuBackend::Exec cpu_{};
};

TEST_F(CudaBackendTest, MemoryAllocatesZeroedAndRoundTripsUploads) {
  const int64_t n = 1000;
  float* zeroed = memory_->allocate<float>(n);
  EXPECT_EQ(host_f32(zeroed, n), std::vector<float>(n, 0.0f));
  const std::vector<float> values = random_floats(n, 1);
  memory_->upload(values.data(), zeroed, n);
  EXPECT_EQ(host_f32(zeroed, n), values);
  const std::vector<int64_t> ids = {5, -1, int64_t{1} << 40};
  int64_t* device_ids = device(ids);
  std::vector<int64_t> back(3);
  memory_->download(device_ids, back.data(), 3);
  EXPECT_EQ(back, ids);
  memory_->zero(zeroed + 10, 20);
  memory_->synchronize();
  std::vector<float> expected = values;
  std::fill_n(expected.begin() + 10, 20, 0.0f);
  EXPECT_EQ(host_f32(zeroed, n), expected);
}

TEST_F(CudaBackendTest, ComputeCopyIsTheBf16RoundingOfTheMaster) {
  const int64_t n = 777;
  std::vector<float> master = random_floats(n, 2, -100.0f, 100.0f);
  float* device_master = device(master);
  bf16* copy = memory_->compute_copy(device_master, n);
  memory_->synchronize();
  EXPECT_EQ(host_f32(copy, n), bf16_rounded(master));
  master = random_floats(n, 3);
  memory_->upload(master.data(), device_master, n);
  memory_->refresh(device_master, copy, n);
  memory_->synchronize();
  EXPECT_EQ(host_f32(copy, n), bf16_rounded(master));
}

TEST_F(CudaBackendTest, ReleasesItsBlocksToThePool) {
  const int64_t before = pool_->bytes_in_use();
  {
    CudaBackend::Memory memory(CudaBackend::MemoryConfig{pool_.get()});
    memory.allocate<float>(100);
    memory.allocate<bf16>(0);  // still a block of its own
    EXPECT_EQ(pool_->bytes_in_use(), before + 512 + 256);
    memory.synchronize();
  }
  EXPECT_EQ(pool_->bytes_in_use(), before);
}

TEST_F(CudaBackendTest, SplitAndMergeQkvRoundTripExactly) {
  const int64_t rows = 7, q_width = 12, kv_width = 4, width = q_width + 2 * kv_width;
  const std::vector<float> qkv = bf16_rounded(random_floats(rows * width, 4));
  std::vector<float> q(rows * q_width), k(rows * kv_width), v(rows * kv_width);
  CpuBackend::split_qkv(cpu_, rows, q_width, kv_width, qkv.data(), q.data(), k.data(), v.data());
  bf16* d_qkv = device_bf16(qkv);
  bf16* d_q = memory_->allocate<bf16>(rows * q_width);
  bf16* d_k = memory_->allocate<bf16>(rows * kv_width);
  bf16* d_v = memory_->allocate<bf16>(rows * kv_width);
  bf16* d_merged = memory_->allocate<bf16>(rows * width);
  memory_->synchronize();
  CudaBackend::split_qkv(exec_, rows, q_width, kv_width, d_qkv, d_q, d_k, d_v);
  EXPECT_EQ(host_f32(d_q, rows * q_width), q);
  EXPECT_EQ(host_f32(d_k, rows * kv_width), k);
  EXPECT_EQ(host_f32(d_v, rows * kv_width), v);
  CudaBackend::merge_qkv(exec_, rows, q_width, kv_width, d_q, d_k, d_v, d_merged);
  EXPECT_EQ(host_f32(d_merged, rows * width), qkv);
  CudaBackend::split_qkv(exec_, 0, q_width, kv_width, d_qkv, d_q, d_k, d_v);  // nothing
  EXPECT_EQ(host_f32(d_q, rows * q_width), q);
}

TEST_F(CudaBackendTest, LinearLayersMatchTheCpu) {
  const int64_t rows = 19, in = 40, out = 24;
  const std::vector<float> x = bf16_rounded(random_floats(rows * in, 5));
  const std::vector<float> w = bf16_rounded(random_floats(out * in, 6));
  const std::vector<float> dy = bf16_rounded(random_floats(rows * out, 7));
  std::vector<float> y(rows * out), dx(rows * in), dw(out * in, 0.5f);
  CpuBackend::linear_forward(cpu_, rows, in, out, x.data(), w.data(), y.data());
  CpuBackend::linear_dgrad(cpu_, rows, in, out, dy.data(), w.data(), dx.data());
  CpuBackend::linear_wgrad_accumulate(cpu_, rows, in, out, dy.data(), x.data(), dw.data());
  bf16 *d_x = device_bf16(x), *d_w = device_bf16(w), *d_dy = device_bf16(dy);
  bf16* d_y = memory_->allocate<bf16>(rows * out);
  bf16* d_dx = memory_->allocate<bf16>(rows * in);
  float* d_dw = device(std::vector<float>(out * in, 0.5f));
  memory_->synchronize();
  CudaBackend::linear_forward(exec_, rows, in, out, d_x, d_w, d_y);
  CudaBackend::linear_dgrad(exec_, rows, in, out, d_dy, d_w, d_dx);
  CudaBackend::linear_wgrad_accumulate(exec_, rows, in, out, d_dy, d_x, d_dw);
  expect_close(host_f32(d_y, rows * out), y, 1e-3f, kBf16Rel, "y");
  expect_close(host_f32(d_dx, rows * in), dx, 1e-3f, kBf16Rel, "dx");
  expect_close(host_f32(d_dw, out * in), dw, 1e-4f, 1e-5f, "dw");
}

TEST_F(CudaBackendTest, EmptyShapesLeaveBuffersAlone) {
  // A product over an empty inner dimension is zeros; no rows or no outputs touch nothing.
  const std::vector<float> ones(12, 1.0f);
  bf16* y = device_bf16(ones);
  float* dw = device(ones);
  CudaBackend::linear_forward(exec_, 0, 4, 3, y, y, y);
  CudaBackend::linear_wgrad_accumulate(exec_, 0, 4, 3, y, y, dw);
  CudaBackend::merge_qkv(exec_, 0, 4, 2, y, y, y, y);
  CudaBackend::add_tensors(exec_, 0, y, y, y);
  EXPECT_EQ(host_f32(y, 12), ones);
  EXPECT_EQ(host_f32(dw, 12), ones);
  CudaBackend::linear_forward(exec_, 2, 0, 3, y, y, y);  // in = 0: y[2, 3] = 0
  std::vector<float> expected = ones;
  std::fill_n(expected.begin(), 6, 0.0f);
  EXPECT_EQ(host_f32(y, 12), expected);
  CudaBackend::linear_dgrad(exec_, 3, 4, 0, y, y, y);  // out = 0: dx[3, 4] = 0
  EXPECT_EQ(host_f32(y, 12), std::vector<float>(12, 0.0f));
}

TEST_F(CudaBackendTest, GemmBoundToAnotherStreamAborts) {
  // Re-executing the binary for the child keeps fork() away from the CUDA runtime's threads.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const CudaBackend::Exec elsewhere{nullptr, gemm_.get(), {}};  // gemm_ is bound to stream_
  EXPECT_DEATH(CudaBackend::linear_forward(elsewhere, 1, 1, 1, nullptr, nullptr, nullptr),
               "check failed: exec.gemm->stream\\(\\) == exec.stream");
}

TEST_F(CudaBackendTest, RmsNormAndResidualAddMatchTheCpu) {
  const int64_t rows = 9, dim = 130;
  const std::vector<float> x = bf16_rounded(random_floats(rows * dim, 8));
  const std::vector<float> dy = bf16_rounded(random_floats(rows * dim, 9));
  const std::vector<float> gain = random_floats(dim, 10, 0.5f, 1.5f);
  std::vector<float> y(rows * dim), rstd(rows), dx(rows * dim), dgain(dim, 0.25f), sum(rows * dim);
  CpuBackend::rmsnorm_forward(cpu_, rows, dim, x.data(), gain.data(), 1e-5f, y.data(), rstd.data());
  CpuBackend::rmsnorm_backward(cpu_, rows, dim, x.data(), gain.data(), rstd.data(), dy.data(),
                               dx.data(), dgain.data());
  CpuBackend::add_tensors(cpu_, rows * dim, x.data(), dy.data(), sum.data());
  bf16 *d_x = device_bf16(x), *d_dy = device_bf16(dy);
  bf16* d_y = memory_->allocate<bf16>(rows * dim);
  bf16* d_dx = memory_->allocate<bf16>(rows * dim);
  bf16* d_sum = memory_->allocate<bf16>(rows * dim);
  float* d_gain = device(gain);
  float* d_rstd = memory_->allocate<float>(rows);
  float* d_dgain = device(std::vector<float>(dim, 0.25f));
  memory_->synchronize();
  CudaBackend::rmsnorm_forward(exec_, rows, dim, d_x, d_gain, 1e-5f, d_y, d_rstd);
  CudaBackend::rmsnorm_backward(exec_, rows, dim, d_x, d_gain, d_rstd, d_dy, d_dx, d_dgain);
  CudaBackend::add_tensors(exec_, rows * dim, d_x, d_dy, d_sum);
  expect_close(host_f32(d_rstd, rows), rstd, 0.0f, 1e-5f, "rstd");
  expect_close(host_f32(d_y, rows * dim), y, 1e-6f, kBf16Rel, "y");
  expect_close(host_f32(d_dx, rows * dim), dx, 1e-3f, kBf16Rel, "dx");
  expect_close(host_f32(d_dgain, dim), dgain, 1e-4f, 1e-4f, "dgain");
  expect_close(host_f32(d_sum, rows * dim), sum, 0.0f, kBf16Rel, "sum");
}

TEST_F(CudaBackendTest, RopeFromTheMemorysTableMatchesTheCpu) {
  const int64_t batch = 2, seq = 5, heads = 3, head_dim = 8, offset = 3;
  const cpu::RopeTable table = cpu::make_rope_table(8, head_dim, 10000.0);
  const CudaBackend::Rope device_table = memory_->rope(table);
  EXPECT_EQ(device_table.positions, 8);
  EXPECT_EQ(device_table.head_dim, head_dim);
  const std::vector<float> x = bf16_rounded(random_floats(batch * seq * heads * head_dim, 11));
  std::vector<float> forward = x, backward = x;
  CpuBackend::rope_forward(cpu_, table, batch, seq, heads, offset, forward.data());
  CpuBackend::rope_backward(cpu_, table, batch, seq, heads, offset, backward.data());
  bf16 *d_forward = device_bf16(x), *d_backward = device_bf16(x);
  memory_->synchronize();
  CudaBackend::rope_forward(exec_, device_table, batch, seq, heads, offset, d_forward);
  CudaBackend::rope_backward(exec_, device_table, batch, seq, heads, offset, d_backward);
  const int64_t n = static_cast<int64_t>(x.size());
  expect_close(host_f32(d_forward, n), forward, 1e-6f, kBf16Rel, "rope forward");
  expect_close(host_f32(d_backward, n), backward, 1e-6f, kBf16Rel, "rope backward");
}

TEST_F(CudaBackendTest, SwiGluMatchesTheCpu) {
  const int64_t rows = 6, ffn = 33;
  const std::vector<float> gate_up = bf16_rounded(random_floats(rows * 2 * ffn, 12, -4, 4));
  const std::vector<float> dout = bf16_rounded(random_floats(rows * ffn, 13));
  std::vector<float> out(rows * ffn), d_gate_up(rows * 2 * ffn);
  CpuBackend::swiglu_forward(cpu_, rows, ffn, gate_up.data(), out.data());
  CpuBackend::swiglu_backward(cpu_, rows, ffn, gate_up.data(), dout.data(), d_gate_up.data());
  bf16 *d_in = device_bf16(gate_up), *d_dout = device_bf16(dout);
  bf16* d_out = memory_->allocate<bf16>(rows * ffn);
  bf16* d_grad = memory_->allocate<bf16>(rows * 2 * ffn);
  memory_->synchronize();
  CudaBackend::swiglu_forward(exec_, rows, ffn, d_in, d_out);
  CudaBackend::swiglu_backward(exec_, rows, ffn, d_in, d_dout, d_grad);
  expect_close(host_f32(d_out, rows * ffn), out, 1e-6f, kBf16Rel, "out");
  expect_close(host_f32(d_grad, rows * 2 * ffn), d_gate_up, 1e-6f, kBf16Rel, "d_gate_up");
}

TEST_F(CudaBackendTest, AttentionMatchesTheCpu) {
  const kernels::AttentionShape shape{
      .batch = 1, .seq = 70, .heads = 4, .kv_heads = 2, .head_dim = 16};
  const int64_t q_size = shape.batch * shape.seq * shape.heads * shape.head_dim;
  const int64_t kv_size = shape.batch * shape.seq * shape.kv_heads * shape.head_dim;
  const int64_t stat_size = shape.batch * shape.heads * shape.seq;
  const std::vector<float> q = bf16_rounded(random_floats(q_size, 14));
  const std::vector<float> k = bf16_rounded(random_floats(kv_size, 15));
  const std::vector<float> v = bf16_rounded(random_floats(kv_size, 16));
  const std::vector<float> dout = bf16_rounded(random_floats(q_size, 17));
  bf16 *d_q = device_bf16(q), *d_k = device_bf16(k), *d_v = device_bf16(v);
  bf16* d_dout = device_bf16(dout);
  bf16* d_out = memory_->allocate<bf16>(q_size);
  bf16* d_dq = memory_->allocate<bf16>(q_size);
  bf16* d_dk = memory_->allocate<bf16>(kv_size);
  bf16* d_dv = memory_->allocate<bf16>(kv_size);
  float* d_lse = memory_->allocate<float>(stat_size);
  float* d_delta = memory_->allocate<float>(stat_size);
  memory_->synchronize();
  std::vector<float> out(q_size), lse(stat_size), dq(q_size), dk(kv_size), dv(kv_size);
  CpuBackend::attention_forward(cpu_, shape, q.data(), k.data(), v.data(), out.data(), lse.data());
  CudaBackend::attention_forward(exec_, shape, d_q, d_k, d_v, d_out, d_lse);
  const std::vector<float> gpu_out = host_f32(d_out, q_size);
  // out is a softmax-weighted mean of v rows in [-1, 1): attention_gpu_test's bounds.
  expect_close(gpu_out, out, 2e-3f, kBf16Rel, "out");
  expect_close(host_f32(d_lse, stat_size), lse, 1e-5f, 1e-5f, "lse");
  // The backward from the GPU's own (bf16) output on both sides; the gradients pass
  // through two bf16 roundings (out and the result), hence 2^-6.
  CpuBackend::attention_backward(cpu_, shape, q.data(), k.data(), v.data(), gpu_out.data(),
                                 lse.data(), dout.data(), dq.data(), dk.data(), dv.data(), nullptr);
  CudaBackend::attention_backward(exec_, shape, d_q, d_k, d_v, d_out, d_lse, d_dout, d_dq, d_dk,
                                  d_dv, d_delta);
  expect_close(host_f32(d_dq, q_size), dq, 5e-3f, 1.0f / 64, "dq");
  expect_close(host_f32(d_dk, kv_size), dk, 5e-3f, 1.0f / 64, "dk");
  expect_close(host_f32(d_dv, kv_size), dv, 5e-3f, 1.0f / 64, "dv");
}

TEST_F(CudaBackendTest, EmbeddingMatchesTheCpuExactly) {
  const int64_t positions = 20, dim = 16, vocab_begin = 8, vocab_local = 8;
  std::vector<int64_t> tokens(positions);
  for (int64_t r = 0; r < positions; ++r) tokens[r] = (r * 5) % 24;  // repeats, other shards
  const std::vector<float> table = bf16_rounded(random_floats(vocab_local * dim, 18));
  const std::vector<float> dout = bf16_rounded(random_floats(positions * dim, 19));
  std::vector<float> out(positions * dim), dtable(vocab_local * dim, 1.0f);
  CpuBackend::embedding_forward(cpu_, positions, dim, tokens.data(), table.data(), vocab_begin,
                                vocab_local, out.data());
  CpuBackend::embedding_backward(cpu_, positions, dim, tokens.data(), dout.data(), vocab_begin,
                                 vocab_local, dtable.data());
  int64_t* d_tokens = device(tokens);
  bf16 *d_table = device_bf16(table), *d_dout = device_bf16(dout);
  bf16* d_out = memory_->allocate<bf16>(positions * dim);
  float* d_dtable = device(std::vector<float>(vocab_local * dim, 1.0f));
  memory_->synchronize();
  CudaBackend::embedding_forward(exec_, positions, dim, d_tokens, d_table, vocab_begin, vocab_local,
                                 d_out);
  CudaBackend::embedding_backward(exec_, positions, dim, d_tokens, d_dout, vocab_begin, vocab_local,
                                  d_dtable);
  EXPECT_EQ(host_f32(d_out, positions * dim), out);          // a gather
  EXPECT_EQ(host_f32(d_dtable, vocab_local * dim), dtable);  // same sums, same order
}

TEST_F(CudaBackendTest, VocabParallelCrossEntropyMatchesTheCpu) {
  // One shard of two: columns [width, 2 width) of the vocabulary; the other shard's stats are
  // made up (any finite stats combine).
  const int64_t rows = 8, width = 30, shards = 2;
  const std::vector<float> logits = bf16_rounded(random_floats(rows * width, 20, -3, 3));
  std::vector<int64_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = (r * 11) % (width * shards);
  targets[2] = -1;  // ignored
  std::vector<float> stats(shards * rows * 3);
  for (int64_t r = 0; r < rows; ++r) {
    stats[r * 3] = 1.5f;
    stats[r * 3 + 1] = 7.0f;
    stats[r * 3 + 2] = targets[r] >= 0 && targets[r] < width ? 0.75f : 0.0f;
  }
  CpuBackend::vocab_parallel_stats(cpu_, rows, width, width, logits.data(), targets.data(),
                                   stats.data() + rows * 3);
  std::vector<float> lse(rows), loss(rows), dlogits(rows * width);
  CpuBackend::vocab_parallel_combine(cpu_, rows, shards, width, stats.data(), targets.data(),
                                     lse.data(), loss.data());
  CpuBackend::vocab_parallel_backward(cpu_, rows, width, width, logits.data(), targets.data(),
                                      lse.data(), 0.5f, dlogits.data());
  int64_t* d_targets = device(targets);
  bf16* d_logits = device_bf16(logits);
  float* d_stats = device(stats);  // shard 0's made-up rows; shard 1's are overwritten
  float* d_lse = memory_->allocate<float>(rows);
  float* d_loss = memory_->allocate<float>(rows);
  bf16* d_dlogits = memory_->allocate<bf16>(rows * width);
  memory_->zero(d_stats + rows * 3, rows * 3);
  memory_->synchronize();
  CudaBackend::vocab_parallel_stats(exec_, rows, width, width, d_logits, d_targets,
                                    d_stats + rows * 3);
  expect_close(host_f32(d_stats, shards * rows * 3), stats, 1e-6f, 1e-5f, "stats");
  CudaBackend::vocab_parallel_combine(exec_, rows, shards, width, d_stats, d_targets, d_lse,
                                      d_loss);
  CudaBackend::vocab_parallel_backward(exec_, rows, width, width, d_logits, d_targets, d_lse, 0.5f,
                                       d_dlogits);
  expect_close(host_f32(d_lse, rows), lse, 1e-6f, 1e-5f, "lse");
  expect_close(host_f32(d_loss, rows), loss, 1e-5f, 1e-5f, "loss");
  expect_close(host_f32(d_dlogits, rows * width), dlogits, 1e-6f, kBf16Rel, "dlogits");
}

}  // namespace
}  // namespace dhelix::cuda
