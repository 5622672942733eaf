#pragma once
// The CPU backend plus the padded MoE kernels' host twin (runtime/cpu/moe_padded_cpu.h):
// a backend that satisfies PaddedMoeBackend, so that MoeLayersOf<PaddedCpuBackend> is
// PaddedMoeLayers (runtime/model/moe_layers_of.h) and the device path's MoE layer runs on
// the host in fp32, where its values can be compared with the CPU runtime's MoeLayersCpu.
//
// It lives with the tests, not in runtime/model/: no runtime path selects it (dhelix-run's
// backends are the CPU's MoeLayersCpu and CUDA's kernels), and a second host backend in the
// runtime would be a backend nobody trains with. The functions it forwards to are runtime
// code (the runtime library's moe_padded_cpu.cc).

#include <cstdint>

#include "runtime/cpu/moe_padded_cpu.h"
#include "runtime/kernels/moe_padded.h"
#include "runtime/model/cpu_backend.h"

namespace dhelix::test {

struct PaddedCpuBackend : rt::CpuBackend {
  static void check_moe_shape(const kernels::MoePaddedShape& shape) { cpu::check_moe_shape(shape); }
  static void moe_route(const Exec&, const kernels::MoePaddedShape& shape, const float* logits,
                        kernels::MoePaddedRouting routing) {
    cpu::moe_route(shape, logits, routing);
  }
  static void moe_permute(const Exec&, const kernels::MoePaddedShape& shape,
                          kernels::MoePaddedRouting routing, const float* x, float* permuted) {
    cpu::moe_permute(shape, routing, x, permuted);
  }
  static void moe_regroup(const Exec&, int64_t ep, int64_t local, int64_t capacity, int64_t hidden,
                          const float* from, float* to, bool to_expert) {
    cpu::moe_regroup(ep, local, capacity, hidden, from, to, to_expert);
  }
  static void moe_unpermute(const Exec&, const kernels::MoePaddedShape& shape,
                            kernels::MoePaddedRouting routing, const float* expert_out, float* y) {
    cpu::moe_unpermute(shape, routing, expert_out, y);
  }
  static void moe_unpermute_backward(const Exec&, const kernels::MoePaddedShape& shape,
                                     kernels::MoePaddedRouting routing, const float* dy,
                                     const float* expert_out, float* d_expert_out, float* dgate) {
    cpu::moe_unpermute_backward(shape, routing, dy, expert_out, d_expert_out, dgate);
  }
  static void moe_permute_backward(const Exec&, const kernels::MoePaddedShape& shape,
                                   kernels::MoePaddedRouting routing, const float* d_permuted,
                                   float* dx) {
    cpu::moe_permute_backward(shape, routing, d_permuted, dx);
  }
  static void moe_router_logits_backward(const Exec&, const kernels::MoePaddedShape& shape,
                                         kernels::MoePaddedRouting routing, const float* dgate,
                                         float aux_dloss, float* dz) {
    cpu::moe_router_logits_backward(shape, routing, dgate, aux_dloss, dz);
  }
  // The shared expert's gate (PaddedSharedExpertBackend).
  static void moe_shared_gate(const Exec&, int64_t rows, const float* logit, float* gate) {
    cpu::moe_shared_gate(rows, logit, gate);
  }
  static void moe_shared_gate_add(const Exec&, int64_t rows, int64_t h, const float* gate,
                                  const float* out, float* y) {
    cpu::moe_shared_gate_add(rows, h, gate, out, y);
  }
  static void moe_shared_gate_scale(const Exec&, int64_t rows, int64_t h, const float* gate,
                                    const float* dy, float* d_out) {
    cpu::moe_shared_gate_scale(rows, h, gate, dy, d_out);
  }
  static void moe_shared_gate_backward(const Exec&, int64_t rows, int64_t h, const float* gate,
                                       const float* dy, const float* out, float* d_logit,
                                       float* d_out) {
    cpu::moe_shared_gate_backward(rows, h, gate, dy, out, d_logit, d_out);
  }
};

}  // namespace dhelix::test
