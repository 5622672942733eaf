#pragma once
// The CPU backend of the model (runtime/model/model_backend.h): fp32 activations in host
// memory, kernels from runtime/cpu/kernels_cpu.h that compute when called. The master
// weights are what the GEMMs read, so compute copies are the masters themselves.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "runtime/cpu/kernels_cpu.h"
#include "runtime/cpu/ring_attention_cpu.h"
#include "runtime/model/element_type.h"
#include "runtime/model/model_backend.h"

namespace dhelix::rt {

struct CpuBackend {
  using Act = float;
  static constexpr ElementType kActivationType = ElementType::kFloat32;
  struct Exec {};
  using Rope = cpu::RopeTable;
  struct MemoryConfig {};

  /// Host buffers whose addresses never change (each its own heap block).
  class Memory {
   public:
    explicit Memory(MemoryConfig = {}) {}
    template <class T>
    T* allocate(int64_t count) {
      const size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T);
      blocks_.push_back(std::make_unique<std::byte[]>(bytes));  // zeroed
      return reinterpret_cast<T*>(blocks_.back().get());
    }
    template <class T>
    void upload(const T* host, T* destination, int64_t count) {
      std::copy_n(host, count, destination);
    }
    template <class T>
    void download(const T* source, T* host, int64_t count) {
      std::copy_n(source, count, host);
    }
    template <class T>
    void zero(T* pointer, int64_t count) {
      std::fill_n(pointer, count, T{});
    }
    /// Fills bytes with all-ones (NaN as fp32): runtime/model/activation_arena.h.
    void poison(std::byte* pointer, int64_t bytes) { std::fill_n(pointer, bytes, std::byte{0xFF}); }
    Act* compute_copy(float* master, int64_t /*count*/) { return master; }
    void refresh(const float* /*master*/, Act* /*copy*/, int64_t /*count*/) {}
    Rope rope(cpu::RopeTable table) { return table; }
    void synchronize() {}

   private:
    std::vector<std::unique_ptr<std::byte[]>> blocks_;
  };

  static void linear_forward(const Exec&, int64_t rows, int64_t in, int64_t out, const float* x,
                             const float* w, float* y) {
    cpu::linear_forward(rows, in, out, x, w, y);
  }
  static void linear_dgrad(const Exec&, int64_t rows, int64_t in, int64_t out, const float* dy,
                           const float* w, float* dx) {
    cpu::linear_dgrad(rows, in, out, dy, w, dx);
  }
  static void linear_wgrad_accumulate(const Exec&, int64_t rows, int64_t in, int64_t out,
                                      const float* dy, const float* x, float* dw) {
    cpu::linear_wgrad_accumulate(rows, in, out, dy, x, dw);
  }
  static void rmsnorm_forward(const Exec&, int64_t rows, int64_t dim, const float* x,
                              const float* gain, float eps, float* y, float* rstd) {
    cpu::rmsnorm_forward(rows, dim, x, gain, eps, y, rstd);
  }
  static void rmsnorm_backward(const Exec&, int64_t rows, int64_t dim, const float* x,
                               const float* gain, const float* rstd, const float* dy, float* dx,
                               float* dgain) {
    cpu::rmsnorm_backward(rows, dim, x, gain, rstd, dy, dx, dgain);
  }
  static void rope_forward(const Exec&, const Rope& table, int64_t batch, int64_t seq,
                           int64_t heads, int64_t offset, float* x) {
    cpu::rope_forward(table, batch, seq, heads, offset, x);
  }
  static void rope_backward(const Exec&, const Rope& table, int64_t batch, int64_t seq,
                            int64_t heads, int64_t offset, float* dy) {
    cpu::rope_backward(table, batch, seq, heads, offset, dy);
  }
  static void swiglu_forward(const Exec&, int64_t rows, int64_t ffn, const float* gate_up,
                             float* out) {
    cpu::swiglu_forward(rows, ffn, gate_up, out);
  }
  static void swiglu_backward(const Exec&, int64_t rows, int64_t ffn, const float* gate_up,
                              const float* dout, float* d_gate_up) {
    cpu::swiglu_backward(rows, ffn, gate_up, dout, d_gate_up);
  }
  static void attention_forward(const Exec&, const kernels::AttentionShape& shape, const float* q,
                                const float* k, const float* v, float* out, float* lse) {
    cpu::attention_forward(shape, q, k, v, kernels::kAttentionTileKeys, out, lse);
  }
  static void attention_backward(const Exec&, const kernels::AttentionShape& shape, const float* q,
                                 const float* k, const float* v, const float* out, const float* lse,
                                 const float* dout, float* dq, float* dk, float* dv,
                                 float* /*delta: the CPU computes it per row*/) {
    cpu::attention_backward(shape, q, k, v, out, lse, dout, dq, dk, dv);
  }
  static void split_qkv(const Exec&, int64_t rows, int64_t q_width, int64_t kv_width,
                        const float* qkv, float* q, float* k, float* v) {
    cpu::split_qkv(rows, q_width, kv_width, qkv, q, k, v);
  }
  static void merge_qkv(const Exec&, int64_t rows, int64_t q_width, int64_t kv_width,
                        const float* q, const float* k, const float* v, float* qkv) {
    cpu::merge_qkv(rows, q_width, kv_width, q, k, v, qkv);
  }
  static void add_tensors(const Exec&, int64_t count, const float* a, const float* b, float* out) {
    cpu::add_tensors(count, a, b, out);
  }
  /// `rows` rows of `width` elements from src (row pitch src_pitch elements) to dst (pitch
  /// dst_pitch): the all-to-alls' packing (layer_ops_ulysses.h).
  static void copy_strided(const Exec&, int64_t rows, int64_t width, const float* src,
                           int64_t src_pitch, float* dst, int64_t dst_pitch) {
    for (int64_t r = 0; r < rows; ++r) {
      std::copy(src + r * src_pitch, src + r * src_pitch + width, dst + r * dst_pitch);
    }
  }
  static void embedding_forward(const Exec&, int64_t positions, int64_t dim, const int64_t* tokens,
                                const float* table, int64_t vocab_begin, int64_t vocab_local,
                                float* out) {
    cpu::embedding_forward(positions, dim, tokens, table, vocab_begin, vocab_local, out);
  }
  static void embedding_backward(const Exec&, int64_t positions, int64_t dim, const int64_t* tokens,
                                 const float* dout, int64_t vocab_begin, int64_t vocab_local,
                                 float* dtable) {
    cpu::embedding_backward(positions, dim, tokens, dout, vocab_begin, vocab_local, dtable);
  }
  static void vocab_parallel_stats(const Exec&, int64_t rows, int64_t vocab_local,
                                   int64_t vocab_begin, const float* logits, const int64_t* targets,
                                   float* stats) {
    cpu::vocab_parallel_stats(rows, vocab_local, vocab_begin, logits, targets, stats);
  }
  static void vocab_parallel_combine(const Exec&, int64_t rows, int64_t shards, int64_t shard_width,
                                     const float* stats, const int64_t* targets, float* lse,
                                     float* loss) {
    cpu::vocab_parallel_combine(rows, shards, shard_width, stats, targets, lse, loss);
  }
  static void vocab_parallel_backward(const Exec&, int64_t rows, int64_t vocab_local,
                                      int64_t vocab_begin, const float* logits,
                                      const int64_t* targets, const float* lse, float dloss,
                                      float* dlogits) {
    cpu::vocab_parallel_backward(rows, vocab_local, vocab_begin, logits, targets, lse, dloss,
                                 dlogits);
  }

  // Context parallelism's ring attention (runtime/model/layer_ops_cp.h, the
  // RingAttentionBackend concept): runtime/cpu/ring_attention_cpu.h.
  using RingState = cpu::RingForwardState;
  /// Empty: ring_forward_start sizes it (host vectors).
  static RingState make_ring_state(const RingStateAllocator&, const kernels::AttentionShape&) {
    return {};
  }
  static void ring_forward_start(const Exec&, const kernels::AttentionShape& shape,
                                 cpu::RingForwardState& state) {
    state.reset(shape);
  }
  static void ring_forward_step(const Exec&, const kernels::AttentionShape& shape,
                                const cpu::RingStep& step, const float* q, const float* k,
                                const float* v, cpu::RingForwardState& state) {
    cpu::ring_attention_forward_step(shape, step, q, k, v, state);
  }
  static void ring_forward_finish(const Exec&, const kernels::AttentionShape& shape,
                                  cpu::RingForwardState& state, float* out, float* lse) {
    cpu::ring_attention_forward_finish(shape, state, out, lse);
  }
  static void ring_backward_delta(const Exec&, const kernels::AttentionShape& shape,
                                  const float* out, const float* dout, float* delta) {
    cpu::ring_attention_backward_delta(shape, out, dout, delta);
  }
  static void ring_backward_step(const Exec&, const kernels::AttentionShape& shape,
                                 const cpu::RingStep& step, const float* q, const float* dout,
                                 const float* lse, const float* delta, const float* k,
                                 const float* v, float* dq_unscaled, float* dk_unscaled,
                                 float* dv) {
    cpu::ring_attention_backward_step(shape, step, q, dout, lse, delta, k, v, dq_unscaled,
                                      dk_unscaled, dv);
  }
  static void ring_scale(const Exec&, const kernels::AttentionShape& shape, int64_t count,
                         float* values) {
    cpu::ring_attention_scale(shape, count, values);
  }
  static void rope_forward_cp(const Exec&, const Rope& table, int64_t batch, int64_t cp,
                              int64_t rank, int64_t chunk, int64_t heads, float* x) {
    cpu::rope_forward_cp(table, batch, cp, rank, chunk, heads, x);
  }
  static void rope_backward_cp(const Exec&, const Rope& table, int64_t batch, int64_t cp,
                               int64_t rank, int64_t chunk, int64_t heads, float* dy) {
    cpu::rope_backward_cp(table, batch, cp, rank, chunk, heads, dy);
  }
  static void copy_tensor(const Exec&, int64_t count, const float* in, float* out) {
    std::copy_n(in, count, out);
  }
  static void zero_tensor(const Exec&, int64_t count, float* x) { std::fill_n(x, count, 0.0f); }
  // Fully sharded data parallelism (runtime/model/fsdp_layers.h): a fill of n bytes, the
  // reduced shards' sum; no compute copy (the fp32 gathered weights are read as they are).
  static void fsdp_fill(const Exec&, void* bytes, int64_t n, int value) {
    std::fill_n(static_cast<std::byte*>(bytes), n, static_cast<std::byte>(value));
  }
  static void fsdp_accumulate(const Exec&, int64_t count, const float* reduced, float* gradient) {
    for (int64_t i = 0; i < count; ++i) gradient[i] += reduced[i];
  }
};

}  // namespace dhelix::rt
