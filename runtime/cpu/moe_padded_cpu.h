#pragma once
// The MoE layer's padded kernels on the host: the twin of runtime/cuda/moe_cuda.h with fp32
// activations, so that the device path's layer (runtime/model/moe_layers_padded.h) can run
// on the CPU and its values be checked against the CPU runtime's own MoE layer
// (tests/runtime/moe_layers_padded_test.cc). No GPU exists in CI, and the CUDA kernels'
// launches are all the device tests see; this file is how the padded layout, the
// regrouping around the padded all-to-alls and the capacity blocks get checked on values.
//
// Same arguments as moe_cuda.h's functions, minus the stream, and the same semantics:
// every function loops, in the CUDA kernels' order, over the per-token, per-assignment and
// per-element functions those kernels call (runtime/kernels/moe_router.h, moe_capacity.h,
// moe_padded.h), so the host computes what one GPU thread computes, element by element,
// in fp32 where the GPU rounds activations to bf16. The router (moe_route_twin.cc) runs the
// kernels' parallel decomposition (runtime/kernels/moe_route_scan.h: warp-per-token top-k,
// tile histograms and scans for the counts and rows, a tree-summed aux loss); the dot
// products sum in the warps' lane-tree order. They differ from runtime/cpu/moe_cpu.h
// (the CPU layer's) in the layout only: E blocks of C rows, zero padding, the padded row of
// an assignment from assign_padded_rows, the kept set from keeps_assignment (which gives
// drop_over_capacity's set), the counts in elements for the padded all-to-all.
//
// Overloads of moe_cpu.h's names, told apart by the shape type (kernels::MoePaddedShape
// here, cpu::MoeLayerShape there). Shapes: T tokens, h hidden, E experts, top-k k,
// capacity C > 0; the routing (kernels::MoePaddedRouting) in host memory.

#include <cstdint>

#include "runtime/kernels/moe_padded.h"

namespace dhelix::cpu {

/// Throws Error(kUnsupported) naming the limit for a shape these functions cannot run:
/// capacity 0 (dropless routing pads to C = T, moe_capacity.h), k outside [1, E]. No bound on E
/// (the CUDA kernels' per-thread arrays are host vectors here).
void check_moe_shape(const kernels::MoePaddedShape& shape);

/// From the router's logits [T, E]: top-k and softmax per token, the full softmax, the kept
/// assignments, their padded rows, the per-expert element counts and L_aux
/// (cuda::moe_route).
void moe_route(const kernels::MoePaddedShape& shape, const float* logits,
               kernels::MoePaddedRouting routing);
/// permuted[E C, h]: zero, then row[a] = x[a / k] for every kept assignment.
void moe_permute(const kernels::MoePaddedShape& shape, kernels::MoePaddedRouting routing,
                 const float* x, float* permuted);
/// Copies [ep][local][C] rows of h to [local][ep][C] (to_expert) or back; from != to.
void moe_regroup(int64_t ep, int64_t local, int64_t capacity, int64_t hidden, const float* from,
                 float* to, bool to_expert);
/// y[T, h] = sum_j (j ascending, kept only) gate * expert_out[row(t, j)]; expert_out [E C, h].
void moe_unpermute(const kernels::MoePaddedShape& shape, kernels::MoePaddedRouting routing,
                   const float* expert_out, float* y);
/// d_expert_out[E C, h] (zero, then gate * dy at kept rows) and dgate[T, k]
/// (<dy_t, expert_out[row]> in kernels::lane_tree_sum's order, the CUDA warp's; 0 when
/// dropped).
void moe_unpermute_backward(const kernels::MoePaddedShape& shape, kernels::MoePaddedRouting routing,
                            const float* dy, const float* expert_out, float* d_expert_out,
                            float* dgate);
/// dx[T, h] = sum_j (kept, j ascending) d_permuted[row(t, j)].
void moe_permute_backward(const kernels::MoePaddedShape& shape, kernels::MoePaddedRouting routing,
                          const float* d_permuted, float* dx);
/// dz[T, E] from dgate and the load-balancing loss weighted by aux_dloss
/// (cuda::moe_router_logits_backward).
void moe_router_logits_backward(const kernels::MoePaddedShape& shape,
                                kernels::MoePaddedRouting routing, const float* dgate,
                                float aux_dloss, float* dz);

// The shared expert's gate steps (runtime/cuda/moe_shared_cuda.h's twins, row by row with
// runtime/kernels/moe_shared_gate.h's functions).
/// gate[n] = sigmoid(logit[n]).
void moe_shared_gate(int64_t rows, const float* logit, float* gate);
/// y[rows, h] += gate[r] * out[rows, h].
void moe_shared_gate_add(int64_t rows, int64_t hidden, const float* gate, const float* out,
                         float* y);
/// d_out[rows, h] = gate[r] * dy[rows, h].
void moe_shared_gate_scale(int64_t rows, int64_t hidden, const float* gate, const float* dy,
                           float* d_out);
/// d_logit[rows] = <dy_r, out_r> g (1 - g) and d_out[rows, h] = g dy.
void moe_shared_gate_backward(int64_t rows, int64_t hidden, const float* gate, const float* dy,
                              const float* out, float* d_logit, float* d_out);

}  // namespace dhelix::cpu
