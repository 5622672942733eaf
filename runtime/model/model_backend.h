#pragma once
// What a backend gives the model (runtime/model/stage_model.h). The model's op wiring is
// written once, as templates over a backend B; a backend is a struct of types and static
// functions, checked by the ModelBackend concept below. Two exist:
//   CpuBackend  (runtime/model/cpu_backend.h): fp32 everywhere, host memory, kernels that
//               compute when called (runtime/cpu/kernels_cpu.h);
//   CudaBackend (runtime/cuda/cuda_model_backend.h): bf16 activations in device memory,
//               kernels enqueued on the stream of the Exec they are given.
//
// Types:
//   Act          element of activations, activation gradients, the residual stream and
//                the weight copies the GEMMs read; kActivationType names it.
//   Exec         what a bound op needs to run (CPU: nothing; CUDA: stream and cuBLAS).
//   Rope         the RoPE table as the kernels read it (built from cpu::make_rope_table).
//   MemoryConfig where buffers come from (CUDA: the device pool); default-constructible.
//   Memory       owns every buffer of one model, constructed from a MemoryConfig:
//     allocate<T>(count)          zeroed buffer whose address never changes
//     upload(host, dst, count)    host -> memory, done when it returns (T = float, int64_t)
//     download(src, host, count)  memory -> host, after the work writing src has finished
//     zero(p, count)              p[0, count) = 0 before any op enqueued after the call
//     poison(bytes, n)            bytes[0, n) = 0xFF (NaN): the activation arena's fill
//     compute_copy(master, count) the Act copy of fp32 master weights (CPU: master itself)
//     refresh(master, copy, count) rewrites a compute copy (CPU: nothing)
//     rope(table)                 the table in the kernels' memory
//     synchronize()               every upload, zero and refresh has finished
//
// Kernels (static, first argument const Exec&; shapes and contracts as
// runtime/cpu/kernels_cpu.h, with activations as Act and statistics, gains and weight
// gradients as float): linear_forward, linear_dgrad, linear_wgrad_accumulate,
// rmsnorm_forward, rmsnorm_backward, rope_forward, rope_backward, swiglu_forward,
// swiglu_backward, attention_forward, attention_backward (with an fp32 delta scratch the
// CPU ignores), split_qkv, merge_qkv, add_tensors, embedding_forward, embedding_backward,
// vocab_parallel_stats, vocab_parallel_combine, vocab_parallel_backward.

#include <concepts>
#include <cstdint>
#include <functional>
#include <string_view>

#include "runtime/cpu/kernels_cpu.h"
#include "runtime/model/element_type.h"

namespace dhelix::rt {

/// Where a backend's ring-attention state (B::make_ring_state) gets its fp32 buffers: the
/// model's activation arena (runtime/model/activation_arena.h), by name.
using RingStateAllocator = std::function<float*(std::string_view name, int64_t count)>;

template <class B>
concept ModelBackend = requires(typename B::Memory& memory, const typename B::Exec& exec,
                                typename B::Act* act, const typename B::Act* cact, float* f,
                                const float* cf, const int64_t* ids, int64_t n) {
  typename B::Act;
  typename B::Exec;
  typename B::Rope;
  typename B::MemoryConfig;
  { B::kActivationType } -> std::convertible_to<ElementType>;
  { memory.template allocate<float>(n) } -> std::same_as<float*>;
  { memory.compute_copy(f, n) } -> std::same_as<typename B::Act*>;
  { memory.rope(cpu::RopeTable{}) } -> std::same_as<typename B::Rope>;
  memory.synchronize();
  B::linear_forward(exec, n, n, n, cact, cact, act);
  B::linear_wgrad_accumulate(exec, n, n, n, cact, cact, f);
  B::rmsnorm_forward(exec, n, n, cact, cf, 1.0f, act, f);
  B::vocab_parallel_combine(exec, n, n, n, cf, ids, f, f);
};

}  // namespace dhelix::rt
