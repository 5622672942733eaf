#pragma once
// The MoE layer's kernels on the GPU: the CUDA twin of runtime/cpu/moe_cpu.h, with every buffer
// between permute and unpermute padded to the capacity (runtime/kernels/moe_padded.h) so that its
// shape is known on the host and the all-to-alls and expert GEMMs are enqueued without reading the
// routing back.
//
// The math is shared: each token's top-k and softmax weights are moe_router.h's
// (router_ranks_before decides each slot by a warp reduction, router_topk_gates the
// weights), the router backward its router_backward_element, the load-balancing loss
// moe_capacity.h's; dropping is moe_capacity.h's keeps_assignment per assignment (the same
// kept set as the CPU's sort; O(1) for an expert within its capacity, O(T k) over it). The
// counts and the padded rows come from a histogram and an exclusive scan over tiles of
// assignments (runtime/kernels/moe_route_scan.h, with a worked example: the positions
// assign_padded_rows gives, in the CPU's order within an expert), the aux loss from a
// block reduction and a final pass. So on the same logits the routing is the CPU's exactly
// (tests/gpu/moe_gpu_test.cc checks it; tests/runtime/moe_route_scan_test.cc checks the
// decomposition on the host twin), and the values differ by bf16 rounding and the order of
// the warp sums (probabilities, dgate, dz: lane-tree order, kernels::lane_tree_sum).
//
// Shapes: T tokens, h hidden, E experts, top-k k, capacity C. Activations and their
// gradients bf16; router logits bf16 (the router GEMM's output) read as fp32; gate
// weights, probabilities, dgate and the aux loss fp32. The routing lives in device memory
// (MoeDeviceRouting), written by moe_route and read by the others.
//
// Every function enqueues on `stream` and returns; no host wait, no allocation (the
// router's scratch is the stream's workspace). Deterministic: one thread per output
// element, a warp per token or assignment, fixed loop and tree orders, no atomics.
// The expert GEMMs are the cuBLAS wrapper's (cublas_gemm.h) on ep C rows per local expert.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "runtime/cuda/kernels_cuda.h"
#include "runtime/kernels/moe_padded.h"

namespace dhelix::cuda {

/// Most experts a layer may have here: the router's warp holds a token's logits in
/// kMaxMoeExperts / 32 registers per lane, and a tile's per-warp counts in shared memory.
inline constexpr int64_t kMaxMoeExperts = 256;

/// The layer's sizes and its routing in device memory (runtime/kernels/moe_padded.h).
using MoeDeviceShape = kernels::MoePaddedShape;
using MoeDeviceRouting = kernels::MoePaddedRouting;

/// Throws Error(kUnsupported) naming the limit for a shape these kernels cannot run
/// (capacity 0, experts above kMaxMoeExperts, k outside [1, E]).
void check_moe_shape(const MoeDeviceShape& shape);

/// The kernels of kernels_moe.cu and kernels_moe_route.cu (moe_route_kernels), for loading
/// at set-up.
std::vector<KernelEntry> moe_kernels();
std::vector<KernelEntry> moe_route_kernels();

/// Workspace bytes moe_route needs for T tokens, top-k and E experts: the tile counts and
/// the aux loss's block partials (kernels::moe_route_scratch).
int64_t moe_route_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts);

/// From the router's logits [T, E]: top-k and softmax per token, the full softmax, the kept
/// assignments, their padded rows, the per-expert element counts and L_aux. `workspace`
/// holds moe_route_workspace_bytes (Error kInternal naming both sizes otherwise).
void moe_route(const MoeDeviceShape& shape, const bf16* logits, MoeDeviceRouting routing,
               const Workspace& workspace, cudaStream_t stream);
/// permuted[E C, h]: zero, then row[a] = x[a / k] for every kept assignment.
void moe_permute(const MoeDeviceShape& shape, MoeDeviceRouting routing, const bf16* x,
                 bf16* permuted, cudaStream_t stream);
/// Copies [ep][local][C] rows of h to [local][ep][C] (to_expert) or back; from != to.
void moe_regroup(int64_t ep, int64_t local, int64_t capacity, int64_t hidden, const bf16* from,
                 bf16* to, bool to_expert, cudaStream_t stream);
/// y[T, h] = sum_j (j ascending, kept only) gate * expert_out[row(t, j)]; expert_out [E C, h].
void moe_unpermute(const MoeDeviceShape& shape, MoeDeviceRouting routing, const bf16* expert_out,
                   bf16* y, cudaStream_t stream);
/// d_expert_out[E C, h] (zero, then gate * dy at kept rows) and dgate[T, k] (fp32,
/// <dy_t, expert_out[row]>, 0 when dropped).
void moe_unpermute_backward(const MoeDeviceShape& shape, MoeDeviceRouting routing, const bf16* dy,
                            const bf16* expert_out, bf16* d_expert_out, float* dgate,
                            cudaStream_t stream);
/// dx[T, h] = sum_j (kept) d_permuted[row(t, j)].
void moe_permute_backward(const MoeDeviceShape& shape, MoeDeviceRouting routing,
                          const bf16* d_permuted, bf16* dx, cudaStream_t stream);
/// dz[T, E] (bf16, for the router's dgrad and wgrad GEMMs) from dgate and the
/// load-balancing loss weighted by aux_dloss; cpu::moe_router_logits_backward.
void moe_router_logits_backward(const MoeDeviceShape& shape, MoeDeviceRouting routing,
                                const float* dgate, float aux_dloss, bf16* dz, cudaStream_t stream);

}  // namespace dhelix::cuda
