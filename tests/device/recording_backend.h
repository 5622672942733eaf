#pragma once
// A model backend (runtime/model/model_backend.h) for the fake device: CpuBackend's host
// memory and types, kernels that compute nothing and only record their launch (name and
// stream) in a RecordingDevice, GEMMs as the exact cuBLAS shapes CublasGemm would run
// (runtime/cuda/device_setup.h's linear_*_shape). BasicStageModel<RecordingBackend> so
// runs the real model's op wiring on the fake, with the real GEMM shapes.

#include <fmt/format.h>

#include <string>

#include "runtime/cuda/device_setup.h"
#include "runtime/kernels/moe_padded.h"
#include "runtime/model/cpu_backend.h"
#include "tests/device/recording_device.h"

namespace dhelix::cuda::testing {

struct RecordingBackend {
  using Act = float;
  static constexpr rt::ElementType kActivationType = rt::ElementType::kFloat32;
  using Rope = rt::CpuBackend::Rope;
  /// Where the model's allocations are logged (none: not logged).
  struct MemoryConfig {
    RecordingDevice* device = nullptr;
  };
  /// CpuBackend's host memory, each allocation logged as the CUDA backend's would call the
  /// device pool: so a test sees when the model allocates (activation_arena.h).
  class Memory : public rt::CpuBackend::Memory {
   public:
    Memory() : device_(nullptr) {}
    explicit Memory(MemoryConfig config) : device_(config.device) {}
    template <class T>
    T* allocate(int64_t count) {
      if (device_ != nullptr) {
        device_->note_allocation(std::max<int64_t>(count, 1) * static_cast<int64_t>(sizeof(T)));
      }
      return rt::CpuBackend::Memory::allocate<T>(count);
    }

   private:
    RecordingDevice* device_;
  };
  struct Exec {
    RecordingDevice* device = nullptr;
    StreamHandle stream = nullptr;
  };

  static void launch(const Exec& e, const char* kernel) { e.device->kernel(kernel, e.stream); }

  static void linear_forward(const Exec& e, int64_t rows, int64_t in, int64_t out, const float*,
                             const float*, float*) {
    e.device->gemm(linear_forward_shape(rows, in, out), e.stream);
  }
  static void linear_dgrad(const Exec& e, int64_t rows, int64_t in, int64_t out, const float*,
                           const float*, float*) {
    e.device->gemm(linear_dgrad_shape(rows, in, out), e.stream);
  }
  static void linear_wgrad_accumulate(const Exec& e, int64_t rows, int64_t in, int64_t out,
                                      const float*, const float*, float*) {
    e.device->gemm(linear_wgrad_shape(rows, in, out), e.stream);
  }
  static void rmsnorm_forward(const Exec& e, int64_t, int64_t, const float*, const float*, float,
                              float*, float*) {
    launch(e, "rmsnorm_forward");
  }
  static void rmsnorm_backward(const Exec& e, int64_t, int64_t, const float*, const float*,
                               const float*, const float*, float*, float*) {
    launch(e, "rmsnorm_backward");
  }
  static void rope_forward(const Exec& e, const Rope&, int64_t, int64_t, int64_t, int64_t, float*) {
    launch(e, "rope_forward");
  }
  static void rope_backward(const Exec& e, const Rope&, int64_t, int64_t, int64_t, int64_t,
                            float*) {
    launch(e, "rope_backward");
  }
  static void swiglu_forward(const Exec& e, int64_t, int64_t, const float*, float*) {
    launch(e, "swiglu_forward");
  }
  static void swiglu_backward(const Exec& e, int64_t, int64_t, const float*, const float*, float*) {
    launch(e, "swiglu_backward");
  }
  // Attention records its shape too, as prepare_attention labels it, so that the tests can
  // check that the shape the set-up prepared (cuDNN's plans) is the shape that runs.
  static std::string with_shape(const char* kernel, const kernels::AttentionShape& a) {
    return fmt::format("{} batch {} seq {} heads {} kv_heads {} head_dim {}", kernel, a.batch,
                       a.seq, a.heads, a.kv_heads, a.head_dim);
  }
  static void attention_forward(const Exec& e, const kernels::AttentionShape& shape, const float*,
                                const float*, const float*, float*, float*) {
    e.device->kernel(with_shape("attention_forward", shape), e.stream);
  }
  static void attention_backward(const Exec& e, const kernels::AttentionShape& shape, const float*,
                                 const float*, const float*, const float*, const float*,
                                 const float*, float*, float*, float*, float*) {
    e.device->kernel(with_shape("attention_backward", shape), e.stream);
  }
  static void split_qkv(const Exec& e, int64_t, int64_t, int64_t, const float*, float*, float*,
                        float*) {
    launch(e, "split_qkv");
  }
  static void merge_qkv(const Exec& e, int64_t, int64_t, int64_t, const float*, const float*,
                        const float*, float*) {
    launch(e, "merge_qkv");
  }
  static void add_tensors(const Exec& e, int64_t, const float*, const float*, float*) {
    launch(e, "add_tensors");
  }
  static void copy_strided(const Exec& e, int64_t, int64_t, const float*, int64_t, float*,
                           int64_t) {
    launch(e, "copy_strided");
  }
  static void embedding_forward(const Exec& e, int64_t, int64_t, const int64_t*, const float*,
                                int64_t, int64_t, float*) {
    launch(e, "embedding_forward");
  }
  static void embedding_backward(const Exec& e, int64_t, int64_t, const int64_t*, const float*,
                                 int64_t, int64_t, float*) {
    launch(e, "embedding_backward");
  }
  static void vocab_parallel_stats(const Exec& e, int64_t, int64_t, int64_t, const float*,
                                   const int64_t*, float*) {
    launch(e, "vocab_parallel_stats");
  }
  static void vocab_parallel_combine(const Exec& e, int64_t, int64_t, int64_t, const float*,
                                     const int64_t*, float*, float*) {
    launch(e, "vocab_parallel_combine");
  }
  static void vocab_parallel_backward(const Exec& e, int64_t, int64_t, int64_t, const float*,
                                      const int64_t*, const float*, float, float*) {
    launch(e, "vocab_parallel_backward");
  }

  // Context parallelism's ring kernels (runtime/model/layer_ops_cp.h), CudaBackend's list.
  using RingState = cpu::RingForwardState;
  static RingState make_ring_state(const rt::RingStateAllocator&, const kernels::AttentionShape&) {
    return {};
  }
  static void ring_forward_start(const Exec& e, const kernels::AttentionShape&, RingState&) {
    launch(e, "ring_forward_start");
  }
  static void ring_forward_step(const Exec& e, const kernels::AttentionShape&,
                                const cpu::RingStep& step, const float*, const float*, const float*,
                                RingState&) {
    e.device->kernel(fmt::format("ring_forward_step block {}", step.block_rank), e.stream);
  }
  static void ring_forward_finish(const Exec& e, const kernels::AttentionShape&, RingState&, float*,
                                  float*) {
    launch(e, "ring_forward_finish");
  }
  static void ring_backward_delta(const Exec& e, const kernels::AttentionShape&, const float*,
                                  const float*, float*) {
    launch(e, "ring_backward_delta");
  }
  static void ring_backward_step(const Exec& e, const kernels::AttentionShape&,
                                 const cpu::RingStep& step, const float*, const float*,
                                 const float*, const float*, const float*, const float*, float*,
                                 float*, float*) {
    e.device->kernel(fmt::format("ring_backward_step block {}", step.block_rank), e.stream);
  }
  static void ring_scale(const Exec& e, const kernels::AttentionShape&, int64_t, float*) {
    launch(e, "ring_scale");
  }
  static void rope_forward_cp(const Exec& e, const Rope&, int64_t, int64_t, int64_t, int64_t,
                              int64_t, float*) {
    launch(e, "rope_forward_cp");
  }
  static void rope_backward_cp(const Exec& e, const Rope&, int64_t, int64_t, int64_t, int64_t,
                               int64_t, float*) {
    launch(e, "rope_backward_cp");
  }
  // The MoE layer's padded kernels (runtime/model/moe_layers_padded.h), CudaBackend's list.
  static void check_moe_shape(const kernels::MoePaddedShape&) {}
  static void moe_route(const Exec& e, const kernels::MoePaddedShape&, const float*,
                        kernels::MoePaddedRouting) {
    launch(e, "moe_route");
  }
  static void moe_permute(const Exec& e, const kernels::MoePaddedShape&, kernels::MoePaddedRouting,
                          const float*, float*) {
    launch(e, "moe_permute");
  }
  static void moe_regroup(const Exec& e, int64_t, int64_t, int64_t, int64_t, const float*, float*,
                          bool to_expert) {
    launch(e, to_expert ? "moe_regroup to expert" : "moe_regroup to source");
  }
  static void moe_unpermute(const Exec& e, const kernels::MoePaddedShape&,
                            kernels::MoePaddedRouting, const float*, float*) {
    launch(e, "moe_unpermute");
  }
  static void moe_unpermute_backward(const Exec& e, const kernels::MoePaddedShape&,
                                     kernels::MoePaddedRouting, const float*, const float*, float*,
                                     float*) {
    launch(e, "moe_unpermute_backward");
  }
  static void moe_permute_backward(const Exec& e, const kernels::MoePaddedShape&,
                                   kernels::MoePaddedRouting, const float*, float*) {
    launch(e, "moe_permute_backward");
  }
  static void moe_router_logits_backward(const Exec& e, const kernels::MoePaddedShape&,
                                         kernels::MoePaddedRouting, const float*, float, float*) {
    launch(e, "moe_router_logits_backward");
  }
  // The shared expert's gate (runtime/model/moe_shared_expert_padded.h), CudaBackend's list.
  static void moe_shared_gate(const Exec& e, int64_t, const float*, float*) {
    launch(e, "moe_shared_gate");
  }
  static void moe_shared_gate_add(const Exec& e, int64_t, int64_t, const float*, const float*,
                                  float*) {
    launch(e, "moe_shared_gate_add");
  }
  static void moe_shared_gate_scale(const Exec& e, int64_t, int64_t, const float*, const float*,
                                    float*) {
    launch(e, "moe_shared_gate_scale");
  }
  static void moe_shared_gate_backward(const Exec& e, int64_t, int64_t, const float*, const float*,
                                       const float*, float*, float*) {
    launch(e, "moe_shared_gate_backward");
  }
  static void copy_tensor(const Exec& e, int64_t, const float*, float*) { launch(e, "copy"); }
  static void zero_tensor(const Exec& e, int64_t, float*) { launch(e, "zero"); }
  // FSDP (runtime/model/fsdp_layers.h): the fills name what they do and how many bytes, so
  // a test sees every gathered buffer released and every whole gradient zeroed.
  static void fsdp_fill(const Exec& e, void*, int64_t n, int value) {
    e.device->kernel(fmt::format("fsdp_fill {} bytes {}", value == 0 ? "zero" : "release", n),
                     e.stream);
  }
  static void fsdp_accumulate(const Exec& e, int64_t count, const float*, float*) {
    e.device->kernel(fmt::format("fsdp_accumulate {}", count), e.stream);
  }
};

}  // namespace dhelix::cuda::testing
