#include "runtime/cuda/cuda_model_backend.h"

#include "runtime/cuda/moe_cuda.h"
#include "runtime/cuda/moe_shared_cuda.h"

#include <algorithm>
#include <utility>

#include "lib/error.h"
#include "runtime/cuda/cublas_gemm.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cudnn_sdpa.h"
#include "runtime/cuda/device_pool.h"
#include "runtime/kernels/context_parallel.h"
#include "runtime/model/model_backend.h"

namespace dhelix::cuda {

static_assert(rt::ModelBackend<CudaBackend>);

namespace {

using bf16 = CudaBackend::Act;

// The handle must enqueue on the op's own stream: a handle bound to another stream would
// run the GEMM outside the order the stream lowering established, silently.
cuda::CublasGemm& gemm_of(const CudaBackend::Exec& exec) {
  DHELIX_CHECK(exec.gemm != nullptr);
  DHELIX_CHECK(exec.gemm->stream() == exec.stream);
  return *exec.gemm;
}

size_t as_size(int64_t bytes) {
  DHELIX_CHECK(bytes >= 0);
  return static_cast<size_t>(bytes);
}

// A product over an empty inner dimension is all zeros; cuBLAS rejects the leading
// dimension 0 such an operand has, so it is written directly.
void zero_product(const CudaBackend::Exec& exec, int64_t count, bf16* out) {
  DHELIX_CUDA(cudaMemsetAsync(out, 0, as_size(count) * sizeof(bf16), exec.stream));
}

}  // namespace

QkvCopyPlan qkv_copy_plan(int64_t rows, int64_t q_width, int64_t kv_width) {
  DHELIX_CHECK(rows >= 0 && q_width >= 0 && kv_width >= 0);
  const int64_t element = static_cast<int64_t>(sizeof(bf16));
  const int64_t pitch = (q_width + 2 * kv_width) * element;
  QkvCopyPlan plan;
  plan.rows = rows;
  plan.blocks[0] = {0, q_width * element, pitch};
  plan.blocks[1] = {q_width * element, kv_width * element, pitch};
  plan.blocks[2] = {(q_width + kv_width) * element, kv_width * element, pitch};
  return plan;
}

// ---- Memory ----------------------------------------------------------------------------

CudaBackend::Memory::Memory(MemoryConfig config) : pool_(config.pool) {
  DHELIX_CHECK(pool_ != nullptr);
}

CudaBackend::Memory::Memory(Memory&& other) noexcept
    : pool_(other.pool_), blocks_(std::exchange(other.blocks_, {})) {}

CudaBackend::Memory::~Memory() {
  for (void* block : blocks_) {
    // release() only throws for a pointer the pool did not hand out, and every block here
    // came from it; a destructor must not throw in any case.
    try {
      pool_->release(block);
    } catch (...) {
    }
  }
}

cudaStream_t CudaBackend::Memory::stream() const { return pool_->stream(); }

void* CudaBackend::Memory::allocate_bytes(int64_t bytes) {
  DHELIX_CHECK(bytes >= 0);
  const int64_t reserved = std::max<int64_t>(bytes, 1);  // the pool hands out no empty block
  void* block = pool_->allocate(reserved);
  blocks_.push_back(block);
  DHELIX_CUDA(cudaMemsetAsync(block, 0, as_size(reserved), stream()));
  return block;
}

void CudaBackend::Memory::upload_bytes(const void* host, void* destination, int64_t bytes) {
  if (bytes == 0) return;
  DHELIX_CUDA(cudaMemcpyAsync(destination, host, as_size(bytes), cudaMemcpyHostToDevice, stream()));
  DHELIX_CUDA(cudaStreamSynchronize(stream()));
}

void CudaBackend::Memory::poison(std::byte* pointer, int64_t bytes) {
  if (bytes == 0) return;
  DHELIX_CUDA(cudaMemsetAsync(pointer, 0xFF, as_size(bytes), stream()));
}

void CudaBackend::Memory::download_bytes(const void* source, void* host, int64_t bytes) {
  if (bytes == 0) return;
  DHELIX_CUDA(cudaMemcpyAsync(host, source, as_size(bytes), cudaMemcpyDeviceToHost, stream()));
  DHELIX_CUDA(cudaStreamSynchronize(stream()));
}

void CudaBackend::Memory::zero_bytes(void* pointer, int64_t bytes) {
  if (bytes == 0) return;
  DHELIX_CUDA(cudaMemsetAsync(pointer, 0, as_size(bytes), stream()));
}

CudaBackend::Act* CudaBackend::Memory::compute_copy(float* master, int64_t count) {
  Act* copy = allocate<Act>(count);
  refresh(master, copy, count);
  return copy;
}

void CudaBackend::Memory::refresh(const float* master, Act* copy, int64_t count) {
  cuda::convert_to_bf16(count, master, copy, stream());
}

CudaBackend::Rope CudaBackend::Memory::rope(cpu::RopeTable table) {
  DHELIX_CHECK(table.cos.size() == table.sin.size());
  const int64_t count = static_cast<int64_t>(table.cos.size());
  float* cos = allocate<float>(count);
  float* sin = allocate<float>(count);
  upload(table.cos.data(), cos, count);
  upload(table.sin.data(), sin, count);
  return Rope{cos, sin, table.positions, table.head_dim};
}

void CudaBackend::Memory::synchronize() { DHELIX_CUDA(cudaStreamSynchronize(stream())); }

// ---- Kernels ---------------------------------------------------------------------------

void CudaBackend::linear_forward(const Exec& exec, int64_t rows, int64_t in, int64_t out,
                                 const Act* x, const Act* w, Act* y) {
  cuda::CublasGemm& gemm = gemm_of(exec);
  if (rows == 0 || out == 0) return;
  if (in == 0) {
    zero_product(exec, rows * out, y);
  } else {
    gemm.linear_forward(rows, in, out, x, w, y);
  }
}

void CudaBackend::linear_dgrad(const Exec& exec, int64_t rows, int64_t in, int64_t out,
                               const Act* dy, const Act* w, Act* dx) {
  cuda::CublasGemm& gemm = gemm_of(exec);
  if (rows == 0 || in == 0) return;
  if (out == 0) {
    zero_product(exec, rows * in, dx);
  } else {
    gemm.linear_dgrad(rows, in, out, dy, w, dx);
  }
}

void CudaBackend::linear_wgrad_accumulate(const Exec& exec, int64_t rows, int64_t in, int64_t out,
                                          const Act* dy, const Act* x, float* dw) {
  cuda::CublasGemm& gemm = gemm_of(exec);
  if (rows == 0 || in == 0 || out == 0) return;  // dw += nothing
  gemm.linear_wgrad_accumulate(rows, in, out, dy, x, dw);
}

void CudaBackend::rmsnorm_forward(const Exec& exec, int64_t rows, int64_t dim, const Act* x,
                                  const float* gain, float eps, Act* y, float* rstd) {
  cuda::rmsnorm_forward(rows, dim, x, gain, eps, y, rstd, exec.stream);
}

void CudaBackend::rmsnorm_backward(const Exec& exec, int64_t rows, int64_t dim, const Act* x,
                                   const float* gain, const float* rstd, const Act* dy, Act* dx,
                                   float* dgain) {
  cuda::rmsnorm_backward(rows, dim, x, gain, rstd, dy, dx, dgain, exec.workspace, exec.stream);
}

void CudaBackend::rope_forward(const Exec& exec, const Rope& table, int64_t batch, int64_t seq,
                               int64_t heads, int64_t offset, Act* x) {
  cuda::rope_forward(table, batch, seq, heads, offset, x, exec.stream);
}

void CudaBackend::rope_backward(const Exec& exec, const Rope& table, int64_t batch, int64_t seq,
                                int64_t heads, int64_t offset, Act* dy) {
  cuda::rope_backward(table, batch, seq, heads, offset, dy, exec.stream);
}

void CudaBackend::swiglu_forward(const Exec& exec, int64_t rows, int64_t ffn, const Act* gate_up,
                                 Act* out) {
  cuda::swiglu_forward(rows, ffn, gate_up, out, exec.stream);
}

void CudaBackend::swiglu_backward(const Exec& exec, int64_t rows, int64_t ffn, const Act* gate_up,
                                  const Act* dout, Act* d_gate_up) {
  cuda::swiglu_backward(rows, ffn, gate_up, dout, d_gate_up, exec.stream);
}

void CudaBackend::attention_forward(const Exec& exec, const kernels::AttentionShape& shape,
                                    const Act* q, const Act* k, const Act* v, Act* out,
                                    float* lse) {
  if (exec.cudnn != nullptr && exec.cudnn->has_plans(shape)) {
    exec.cudnn->forward(shape, q, k, v, out, lse, exec.workspace, exec.stream);
    return;
  }
  cuda::attention_forward(shape, q, k, v, out, lse, exec.stream);
}

void CudaBackend::attention_backward(const Exec& exec, const kernels::AttentionShape& shape,
                                     const Act* q, const Act* k, const Act* v, const Act* out,
                                     const float* lse, const Act* dout, Act* dq, Act* dk, Act* dv,
                                     float* delta) {
  if (exec.cudnn != nullptr && exec.cudnn->has_plans(shape)) {
    exec.cudnn->backward(shape, q, k, v, out, lse, dout, dq, dk, dv, delta, exec.workspace,
                         exec.stream);
    return;
  }
  cuda::attention_backward(shape, q, k, v, out, lse, dout, dq, dk, dv, delta, exec.stream);
}

void CudaBackend::split_qkv(const Exec& exec, int64_t rows, int64_t q_width, int64_t kv_width,
                            const Act* qkv, Act* q, Act* k, Act* v) {
  const QkvCopyPlan plan = qkv_copy_plan(rows, q_width, kv_width);
  const std::array<Act*, 3> parts = {q, k, v};
  const auto* fused = reinterpret_cast<const unsigned char*>(qkv);
  for (size_t i = 0; i < parts.size(); ++i) {
    const QkvBlockCopy& block = plan.blocks[i];
    if (plan.rows == 0 || block.width_bytes == 0) continue;
    DHELIX_CUDA(cudaMemcpy2DAsync(parts[i], as_size(block.width_bytes),
                                  fused + block.column_offset_bytes,
                                  as_size(block.fused_pitch_bytes), as_size(block.width_bytes),
                                  as_size(plan.rows), cudaMemcpyDeviceToDevice, exec.stream));
  }
}

void CudaBackend::merge_qkv(const Exec& exec, int64_t rows, int64_t q_width, int64_t kv_width,
                            const Act* q, const Act* k, const Act* v, Act* qkv) {
  const QkvCopyPlan plan = qkv_copy_plan(rows, q_width, kv_width);
  const std::array<const Act*, 3> parts = {q, k, v};
  auto* fused = reinterpret_cast<unsigned char*>(qkv);
  for (size_t i = 0; i < parts.size(); ++i) {
    const QkvBlockCopy& block = plan.blocks[i];
    if (plan.rows == 0 || block.width_bytes == 0) continue;
    DHELIX_CUDA(cudaMemcpy2DAsync(fused + block.column_offset_bytes,
                                  as_size(block.fused_pitch_bytes), parts[i],
                                  as_size(block.width_bytes), as_size(block.width_bytes),
                                  as_size(plan.rows), cudaMemcpyDeviceToDevice, exec.stream));
  }
}

void CudaBackend::copy_strided(const Exec& exec, int64_t rows, int64_t width, const Act* src,
                               int64_t src_pitch, Act* dst, int64_t dst_pitch) {
  if (rows == 0 || width == 0) return;
  DHELIX_CUDA(cudaMemcpy2DAsync(dst, as_size(dst_pitch) * sizeof(Act), src,
                                as_size(src_pitch) * sizeof(Act), as_size(width) * sizeof(Act),
                                as_size(rows), cudaMemcpyDeviceToDevice, exec.stream));
}

void CudaBackend::add_tensors(const Exec& exec, int64_t count, const Act* a, const Act* b,
                              Act* out) {
  cuda::add_tensors(count, a, b, out, exec.stream);
}

CudaBackend::RingState CudaBackend::make_ring_state(const rt::RingStateAllocator& allocate,
                                                    const kernels::AttentionShape& shape) {
  return {.stats = allocate("ring_stats", ring_state_stats_elements(shape)),
          .acc = allocate("ring_acc", ring_state_acc_elements(shape))};
}

void CudaBackend::ring_forward_start(const Exec& exec, const kernels::AttentionShape& shape,
                                     RingState& state) {
  cuda::ring_forward_start(shape, state, exec.stream);
}

void CudaBackend::ring_forward_step(const Exec& exec, const kernels::AttentionShape& shape,
                                    const cpu::RingStep& step, const Act* q, const Act* k,
                                    const Act* v, RingState& state) {
  cuda::ring_forward_step(shape, step, q, k, v, state, exec.stream);
}

void CudaBackend::ring_forward_finish(const Exec& exec, const kernels::AttentionShape& shape,
                                      RingState& state, Act* out, float* lse) {
  cuda::ring_forward_finish(shape, state, out, lse, exec.stream);
}

void CudaBackend::ring_backward_delta(const Exec& exec, const kernels::AttentionShape& shape,
                                      const Act* out, const Act* dout, float* delta) {
  cuda::ring_backward_delta(shape, out, dout, delta, exec.stream);
}

void CudaBackend::ring_backward_step(const Exec& exec, const kernels::AttentionShape& shape,
                                     const cpu::RingStep& step, const Act* q, const Act* dout,
                                     const float* lse, const float* delta, const Act* k,
                                     const Act* v, Act* dq_unscaled, Act* dk_unscaled, Act* dv) {
  cuda::ring_backward_step(shape, step, q, dout, lse, delta, k, v, dq_unscaled, dk_unscaled, dv,
                           exec.stream);
}

void CudaBackend::check_moe_shape(const kernels::MoePaddedShape& shape) {
  cuda::check_moe_shape(shape);
}

void CudaBackend::moe_route(const Exec& exec, const kernels::MoePaddedShape& shape,
                            const Act* logits, kernels::MoePaddedRouting routing) {
  cuda::moe_route(shape, logits, routing, exec.workspace, exec.stream);
}

void CudaBackend::moe_permute(const Exec& exec, const kernels::MoePaddedShape& shape,
                              kernels::MoePaddedRouting routing, const Act* x, Act* permuted) {
  cuda::moe_permute(shape, routing, x, permuted, exec.stream);
}

void CudaBackend::moe_regroup(const Exec& exec, int64_t ep, int64_t local, int64_t capacity,
                              int64_t hidden, const Act* from, Act* to, bool to_expert) {
  cuda::moe_regroup(ep, local, capacity, hidden, from, to, to_expert, exec.stream);
}

void CudaBackend::moe_unpermute(const Exec& exec, const kernels::MoePaddedShape& shape,
                                kernels::MoePaddedRouting routing, const Act* expert_out, Act* y) {
  cuda::moe_unpermute(shape, routing, expert_out, y, exec.stream);
}

void CudaBackend::moe_unpermute_backward(const Exec& exec, const kernels::MoePaddedShape& shape,
                                         kernels::MoePaddedRouting routing, const Act* dy,
                                         const Act* expert_out, Act* d_expert_out, float* dgate) {
  cuda::moe_unpermute_backward(shape, routing, dy, expert_out, d_expert_out, dgate, exec.stream);
}

void CudaBackend::moe_permute_backward(const Exec& exec, const kernels::MoePaddedShape& shape,
                                       kernels::MoePaddedRouting routing, const Act* d_permuted,
                                       Act* dx) {
  cuda::moe_permute_backward(shape, routing, d_permuted, dx, exec.stream);
}

void CudaBackend::moe_router_logits_backward(const Exec& exec, const kernels::MoePaddedShape& shape,
                                             kernels::MoePaddedRouting routing, const float* dgate,
                                             float aux_dloss, Act* dz) {
  cuda::moe_router_logits_backward(shape, routing, dgate, aux_dloss, dz, exec.stream);
}

void CudaBackend::moe_shared_gate(const Exec& exec, int64_t rows, const Act* logit, float* gate) {
  cuda::moe_shared_gate(rows, logit, gate, exec.stream);
}

void CudaBackend::moe_shared_gate_add(const Exec& exec, int64_t rows, int64_t hidden,
                                      const float* gate, const Act* out, Act* y) {
  cuda::moe_shared_gate_add(rows, hidden, gate, out, y, exec.stream);
}

void CudaBackend::moe_shared_gate_scale(const Exec& exec, int64_t rows, int64_t hidden,
                                        const float* gate, const Act* dy, Act* d_out) {
  cuda::moe_shared_gate_scale(rows, hidden, gate, dy, d_out, exec.stream);
}

void CudaBackend::moe_shared_gate_backward(const Exec& exec, int64_t rows, int64_t hidden,
                                           const float* gate, const Act* dy, const Act* out,
                                           Act* d_logit, Act* d_out) {
  cuda::moe_shared_gate_backward(rows, hidden, gate, dy, out, d_logit, d_out, exec.stream);
}

void CudaBackend::ring_scale(const Exec& exec, const kernels::AttentionShape& shape, int64_t count,
                             Act* values) {
  cuda::scale_tensor(count, kernels::attention_scale(shape.head_dim), values, exec.stream);
}

namespace {

// One rotation per (sequence, chunk) at the chunk's first global position, as
// cpu::rope_forward_cp and rope_backward_cp do.
template <class Rotate>
void rope_cp(const DeviceRopeTable& table, int64_t batch, int64_t cp, int64_t rank, int64_t chunk,
             int64_t heads, bf16* x, Rotate rotate) {
  DHELIX_CHECK(table.positions >= 2 * cp * chunk);
  const int64_t row = heads * table.head_dim;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t half = 0; half < 2; ++half) {
      rotate(kernels::cp_chunk_start(cp, rank, chunk, half),
             x + (b * 2 * chunk + half * chunk) * row);
    }
  }
}

}  // namespace

void CudaBackend::rope_forward_cp(const Exec& exec, const Rope& table, int64_t batch, int64_t cp,
                                  int64_t rank, int64_t chunk, int64_t heads, Act* x) {
  rope_cp(table, batch, cp, rank, chunk, heads, x, [&](int64_t offset, Act* part) {
    cuda::rope_forward(table, 1, chunk, heads, offset, part, exec.stream);
  });
}

void CudaBackend::rope_backward_cp(const Exec& exec, const Rope& table, int64_t batch, int64_t cp,
                                   int64_t rank, int64_t chunk, int64_t heads, Act* dy) {
  rope_cp(table, batch, cp, rank, chunk, heads, dy, [&](int64_t offset, Act* part) {
    cuda::rope_backward(table, 1, chunk, heads, offset, part, exec.stream);
  });
}

void CudaBackend::copy_tensor(const Exec& exec, int64_t count, const Act* in, Act* out) {
  if (count <= 0) return;
  DHELIX_CUDA(cudaMemcpyAsync(out, in, as_size(count * static_cast<int64_t>(sizeof(Act))),
                              cudaMemcpyDeviceToDevice, exec.stream));
}

void CudaBackend::zero_tensor(const Exec& exec, int64_t count, Act* x) {
  if (count <= 0) return;
  DHELIX_CUDA(
      cudaMemsetAsync(x, 0, as_size(count * static_cast<int64_t>(sizeof(Act))), exec.stream));
}

void CudaBackend::fsdp_fill(const Exec& exec, void* bytes, int64_t n, int value) {
  if (n <= 0) return;
  DHELIX_CUDA(cudaMemsetAsync(bytes, value, as_size(n), exec.stream));
}

void CudaBackend::fsdp_accumulate(const Exec& exec, int64_t count, const float* reduced,
                                  float* gradient) {
  if (count > 0) cuda::accumulate_f32(count, reduced, gradient, exec.stream);
}

void CudaBackend::fsdp_compute_copy(const Exec& exec, int64_t count, const float* whole,
                                    Act* copy) {
  if (count > 0) cuda::convert_to_bf16(count, whole, copy, exec.stream);
}

void CudaBackend::embedding_forward(const Exec& exec, int64_t positions, int64_t dim,
                                    const int64_t* tokens, const Act* table, int64_t vocab_begin,
                                    int64_t vocab_local, Act* out) {
  cuda::embedding_forward(positions, dim, tokens, table, vocab_begin, vocab_local, out,
                          exec.stream);
}

void CudaBackend::embedding_backward(const Exec& exec, int64_t positions, int64_t dim,
                                     const int64_t* tokens, const Act* dout, int64_t vocab_begin,
                                     int64_t vocab_local, float* dtable) {
  cuda::embedding_backward(positions, dim, tokens, dout, vocab_begin, vocab_local, dtable,
                           exec.workspace, exec.stream);
}

void CudaBackend::vocab_parallel_stats(const Exec& exec, int64_t rows, int64_t vocab_local,
                                       int64_t vocab_begin, const Act* logits,
                                       const int64_t* targets, float* stats) {
  cuda::vocab_parallel_stats(rows, vocab_local, vocab_begin, logits, targets, stats, exec.stream);
}

void CudaBackend::vocab_parallel_combine(const Exec& exec, int64_t rows, int64_t shards,
                                         int64_t shard_width, const float* stats,
                                         const int64_t* targets, float* lse, float* loss) {
  cuda::vocab_parallel_combine(rows, shards, shard_width, stats, targets, lse, loss, exec.stream);
}

void CudaBackend::vocab_parallel_backward(const Exec& exec, int64_t rows, int64_t vocab_local,
                                          int64_t vocab_begin, const Act* logits,
                                          const int64_t* targets, const float* lse, float dloss,
                                          Act* dlogits) {
  cuda::vocab_parallel_backward(rows, vocab_local, vocab_begin, logits, targets, lse, dloss,
                                dlogits, exec.stream);
}

}  // namespace dhelix::cuda
