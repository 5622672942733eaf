#pragma once
// The CUDA backend of the model (runtime/model/model_backend.h): bf16 activations in device
// memory, every kernel enqueued on the stream of the Exec it is given and never waited for.
// The shapes, argument orders and contracts are CpuBackend's (runtime/model/cpu_backend.h)
// with Act = bf16; statistics (rstd, lse, delta, cross-entropy statistics), RMSNorm gains
// and weight gradients stay fp32 (runtime/cuda/kernels_cuda.h says why).
//
// Memory. Every buffer comes from the rank's DevicePool, whose allocations and releases are
// ordered on the pool's stream; zeroing, uploads, downloads and compute-copy refreshes run
// on that stream too. The model does them while binding and between iterations, then calls
// synchronize(), so no op on another stream can see a buffer before it is ready. Uploads
// and downloads wait for the pool stream before returning: the host buffer of an upload may
// be a temporary, and a download's caller reads the result at once.
//
// Zero-sized shapes launch nothing.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <vector>

#include "runtime/cpu/kernels_cpu.h"
#include "runtime/cuda/kernels_cuda.h"
#include "runtime/cuda/ring_attention_cuda.h"
#include "runtime/kernels/moe_padded.h"
#include "runtime/model/element_type.h"
#include "runtime/model/model_backend.h"

namespace dhelix::cuda {

class CublasGemm;
class CudnnSdpa;
class DevicePool;

/// One column block of the fused QKV matrix [rows, q_width + 2 kv_width] (bf16), as one
/// cudaMemcpy2DAsync copies it: fused side at column_offset_bytes with row pitch
/// fused_pitch_bytes, separate side dense (pitch = width_bytes).
struct QkvBlockCopy {
  int64_t column_offset_bytes = 0;
  int64_t width_bytes = 0;
  int64_t fused_pitch_bytes = 0;
  bool operator==(const QkvBlockCopy&) const = default;
};

/// The three copies of split_qkv and merge_qkv: q, k, v in that order.
struct QkvCopyPlan {
  int64_t rows = 0;
  std::array<QkvBlockCopy, 3> blocks;
};

/// The copies for rows rows of q_width query and kv_width key (and value) bf16 columns.
/// Sizes must be non-negative (DHELIX_CHECK).
QkvCopyPlan qkv_copy_plan(int64_t rows, int64_t q_width, int64_t kv_width);

struct CudaBackend {
  using Act = __nv_bfloat16;
  static constexpr rt::ElementType kActivationType = rt::ElementType::kBFloat16;

  /// Where an op runs: its stream, the cuBLAS handle bound to that same stream (GEMM ops
  /// check it; ops without GEMMs may leave it null) and the stream's scratch memory (the
  /// column reductions' first pass; kernels_cuda.h).
  struct Exec {
    cudaStream_t stream = nullptr;
    cuda::CublasGemm* gemm = nullptr;
    cuda::Workspace workspace;
    /// cuDNN's fused attention when the set-up chose it (attention_path.h); attention of a
    /// shape it has plans for then runs there, everything else on dhelix's kernel.
    cuda::CudnnSdpa* cudnn = nullptr;
  };
  using Rope = cuda::DeviceRopeTable;

  /// The rank's device pool; it must outlive every Memory made from it.
  struct MemoryConfig {
    cuda::DevicePool* pool = nullptr;
  };

  /// The buffers of one model, carved from the pool. Destroy it only once no work that
  /// uses its buffers is pending on any stream (the blocks go back to the pool at once).
  class Memory {
   public:
    /// DHELIX_CHECKs that config.pool is set.
    explicit Memory(MemoryConfig config);
    ~Memory();
    Memory(Memory&& other) noexcept;
    Memory(const Memory&) = delete;
    Memory& operator=(const Memory&) = delete;
    Memory& operator=(Memory&&) = delete;

    /// count elements of T (at least one byte is reserved for count = 0), zeroed on the
    /// pool stream; the address never changes.
    template <class T>
    T* allocate(int64_t count) {
      return static_cast<T*>(allocate_bytes(count * static_cast<int64_t>(sizeof(T))));
    }
    /// host[count] -> destination, finished when it returns.
    template <class T>
    void upload(const T* host, T* destination, int64_t count) {
      upload_bytes(host, destination, count * static_cast<int64_t>(sizeof(T)));
    }
    /// source[count] -> host, finished when it returns. The caller makes sure the work
    /// writing source (on any stream) has finished: only the pool stream is waited for.
    template <class T>
    void download(const T* source, T* host, int64_t count) {
      download_bytes(source, host, count * static_cast<int64_t>(sizeof(T)));
    }
    /// Enqueues pointer[0, count) = 0 on the pool stream (synchronize() waits for it).
    template <class T>
    void zero(T* pointer, int64_t count) {
      zero_bytes(pointer, count * static_cast<int64_t>(sizeof(T)));
    }
    /// Enqueues pointer[0, bytes) = 0xFF (NaN as bf16 and fp32) on the pool stream:
    /// runtime/model/activation_arena.h.
    void poison(std::byte* pointer, int64_t bytes);
    /// A new bf16 buffer holding master[count] rounded to nearest even (enqueued).
    Act* compute_copy(float* master, int64_t count);
    /// Enqueues copy[count] = bf16(master[count]).
    void refresh(const float* master, Act* copy, int64_t count);
    /// The table's cos and sin in device memory (uploaded, finished when it returns).
    Rope rope(cpu::RopeTable table);
    /// Waits for everything enqueued on the pool stream (zeroing, refreshes).
    void synchronize();

   private:
    void* allocate_bytes(int64_t bytes);
    void upload_bytes(const void* host, void* destination, int64_t bytes);
    void download_bytes(const void* source, void* host, int64_t bytes);
    void zero_bytes(void* pointer, int64_t bytes);
    cudaStream_t stream() const;

    cuda::DevicePool* pool_ = nullptr;
    std::vector<void*> blocks_;
  };

  // Kernels: CpuBackend's, argument for argument (see runtime/cpu/kernels_cpu.h).
  static void linear_forward(const Exec& exec, int64_t rows, int64_t in, int64_t out, const Act* x,
                             const Act* w, Act* y);
  static void linear_dgrad(const Exec& exec, int64_t rows, int64_t in, int64_t out, const Act* dy,
                           const Act* w, Act* dx);
  /// dw (fp32) += dy^T x.
  static void linear_wgrad_accumulate(const Exec& exec, int64_t rows, int64_t in, int64_t out,
                                      const Act* dy, const Act* x, float* dw);
  static void rmsnorm_forward(const Exec& exec, int64_t rows, int64_t dim, const Act* x,
                              const float* gain, float eps, Act* y, float* rstd);
  static void rmsnorm_backward(const Exec& exec, int64_t rows, int64_t dim, const Act* x,
                               const float* gain, const float* rstd, const Act* dy, Act* dx,
                               float* dgain);
  static void rope_forward(const Exec& exec, const Rope& table, int64_t batch, int64_t seq,
                           int64_t heads, int64_t offset, Act* x);
  static void rope_backward(const Exec& exec, const Rope& table, int64_t batch, int64_t seq,
                            int64_t heads, int64_t offset, Act* dy);
  static void swiglu_forward(const Exec& exec, int64_t rows, int64_t ffn, const Act* gate_up,
                             Act* out);
  static void swiglu_backward(const Exec& exec, int64_t rows, int64_t ffn, const Act* gate_up,
                              const Act* dout, Act* d_gate_up);
  static void attention_forward(const Exec& exec, const kernels::AttentionShape& shape,
                                const Act* q, const Act* k, const Act* v, Act* out, float* lse);
  /// delta[batch, heads, seq] is fp32 scratch.
  static void attention_backward(const Exec& exec, const kernels::AttentionShape& shape,
                                 const Act* q, const Act* k, const Act* v, const Act* out,
                                 const float* lse, const Act* dout, Act* dq, Act* dk, Act* dv,
                                 float* delta);
  /// Three strided device copies (qkv_copy_plan).
  static void split_qkv(const Exec& exec, int64_t rows, int64_t q_width, int64_t kv_width,
                        const Act* qkv, Act* q, Act* k, Act* v);
  static void merge_qkv(const Exec& exec, int64_t rows, int64_t q_width, int64_t kv_width,
                        const Act* q, const Act* k, const Act* v, Act* qkv);
  static void add_tensors(const Exec& exec, int64_t count, const Act* a, const Act* b, Act* out);
  /// `rows` rows of `width` elements, pitches in elements: one cudaMemcpy2DAsync (the
  /// all-to-alls' packing, runtime/model/layer_ops_ulysses.h).
  static void copy_strided(const Exec& exec, int64_t rows, int64_t width, const Act* src,
                           int64_t src_pitch, Act* dst, int64_t dst_pitch);

  // Context parallelism's ring attention (runtime/model/layer_ops_cp.h, the
  // RingAttentionBackend concept): runtime/cuda/ring_attention_cuda.h, CpuBackend's
  // contracts with Act = bf16.
  using RingState = cuda::RingDeviceState;
  /// The state's device buffers for `shape`, from the model's activation arena when a layer
  /// is bound.
  static RingState make_ring_state(const rt::RingStateAllocator& allocate,
                                   const kernels::AttentionShape& shape);
  static void ring_forward_start(const Exec& exec, const kernels::AttentionShape& shape,
                                 RingState& state);
  static void ring_forward_step(const Exec& exec, const kernels::AttentionShape& shape,
                                const cpu::RingStep& step, const Act* q, const Act* k, const Act* v,
                                RingState& state);
  static void ring_forward_finish(const Exec& exec, const kernels::AttentionShape& shape,
                                  RingState& state, Act* out, float* lse);
  static void ring_backward_delta(const Exec& exec, const kernels::AttentionShape& shape,
                                  const Act* out, const Act* dout, float* delta);
  static void ring_backward_step(const Exec& exec, const kernels::AttentionShape& shape,
                                 const cpu::RingStep& step, const Act* q, const Act* dout,
                                 const float* lse, const float* delta, const Act* k, const Act* v,
                                 Act* dq_unscaled, Act* dk_unscaled, Act* dv);
  static void ring_scale(const Exec& exec, const kernels::AttentionShape& shape, int64_t count,
                         Act* values);
  /// RoPE of the rank's two chunks at their global positions (cpu::rope_forward_cp): one
  /// rope_forward per (sequence, chunk) at the chunk's first position.
  static void rope_forward_cp(const Exec& exec, const Rope& table, int64_t batch, int64_t cp,
                              int64_t rank, int64_t chunk, int64_t heads, Act* x);
  static void rope_backward_cp(const Exec& exec, const Rope& table, int64_t batch, int64_t cp,
                               int64_t rank, int64_t chunk, int64_t heads, Act* dy);
  // The MoE layer's padded kernels (runtime/model/moe_layers_padded.h, the
  // PaddedMoeBackend concept): runtime/cuda/moe_cuda.h on the Exec's stream.
  static void check_moe_shape(const kernels::MoePaddedShape& shape);
  static void moe_route(const Exec& exec, const kernels::MoePaddedShape& shape, const Act* logits,
                        kernels::MoePaddedRouting routing);
  static void moe_permute(const Exec& exec, const kernels::MoePaddedShape& shape,
                          kernels::MoePaddedRouting routing, const Act* x, Act* permuted);
  static void moe_regroup(const Exec& exec, int64_t ep, int64_t local, int64_t capacity,
                          int64_t hidden, const Act* from, Act* to, bool to_expert);
  static void moe_unpermute(const Exec& exec, const kernels::MoePaddedShape& shape,
                            kernels::MoePaddedRouting routing, const Act* expert_out, Act* y);
  static void moe_unpermute_backward(const Exec& exec, const kernels::MoePaddedShape& shape,
                                     kernels::MoePaddedRouting routing, const Act* dy,
                                     const Act* expert_out, Act* d_expert_out, float* dgate);
  static void moe_permute_backward(const Exec& exec, const kernels::MoePaddedShape& shape,
                                   kernels::MoePaddedRouting routing, const Act* d_permuted,
                                   Act* dx);
  static void moe_router_logits_backward(const Exec& exec, const kernels::MoePaddedShape& shape,
                                         kernels::MoePaddedRouting routing, const float* dgate,
                                         float aux_dloss, Act* dz);
  // The shared expert's gate (runtime/model/moe_shared_expert_padded.h, the
  // PaddedSharedExpertBackend concept): runtime/cuda/moe_shared_cuda.h on the Exec's
  // stream; the logit and d_logit bf16 (the h -> 1 GEMMs' output and input), gate fp32.
  static void moe_shared_gate(const Exec& exec, int64_t rows, const Act* logit, float* gate);
  static void moe_shared_gate_add(const Exec& exec, int64_t rows, int64_t hidden, const float* gate,
                                  const Act* out, Act* y);
  static void moe_shared_gate_scale(const Exec& exec, int64_t rows, int64_t hidden,
                                    const float* gate, const Act* dy, Act* d_out);
  static void moe_shared_gate_backward(const Exec& exec, int64_t rows, int64_t hidden,
                                       const float* gate, const Act* dy, const Act* out,
                                       Act* d_logit, Act* d_out);
  /// A device-to-device copy on the stream.
  static void copy_tensor(const Exec& exec, int64_t count, const Act* in, Act* out);
  /// x[count] = 0 on the stream.
  static void zero_tensor(const Exec& exec, int64_t count, Act* x);
  // Fully sharded data parallelism (runtime/model/fsdp_layers.h), on the op's stream:
  /// bytes[0, n) = value (0: a whole gradient zeroed; 0xFF: gathered buffers released).
  static void fsdp_fill(const Exec& exec, void* bytes, int64_t n, int value);
  /// gradient[count] += reduced[count] (fp32).
  static void fsdp_accumulate(const Exec& exec, int64_t count, const float* reduced,
                              float* gradient);
  /// copy[count] = bf16(whole[count]): the gathered weights' copy the GEMMs read.
  static void fsdp_compute_copy(const Exec& exec, int64_t count, const float* whole, Act* copy);
  static void embedding_forward(const Exec& exec, int64_t positions, int64_t dim,
                                const int64_t* tokens, const Act* table, int64_t vocab_begin,
                                int64_t vocab_local, Act* out);
  /// dtable (fp32) += scatter of dout.
  static void embedding_backward(const Exec& exec, int64_t positions, int64_t dim,
                                 const int64_t* tokens, const Act* dout, int64_t vocab_begin,
                                 int64_t vocab_local, float* dtable);
  static void vocab_parallel_stats(const Exec& exec, int64_t rows, int64_t vocab_local,
                                   int64_t vocab_begin, const Act* logits, const int64_t* targets,
                                   float* stats);
  static void vocab_parallel_combine(const Exec& exec, int64_t rows, int64_t shards,
                                     int64_t shard_width, const float* stats,
                                     const int64_t* targets, float* lse, float* loss);
  static void vocab_parallel_backward(const Exec& exec, int64_t rows, int64_t vocab_local,
                                      int64_t vocab_begin, const Act* logits,
                                      const int64_t* targets, const float* lse, float dloss,
                                      Act* dlogits);
};

}  // namespace dhelix::cuda
