// The MoE layer's kernels (moe_cuda.h): routing, capacity, the padded permutation, its
// regrouping for expert parallelism, the combine, and their backward. One thread per
// token, assignment or output element; the per-row math is runtime/kernels/'s.

#include <cuda_bf16.h>
#include <fmt/format.h>

#include "lib/error.h"
#include "runtime/cuda/launch_util.cuh"
#include "runtime/cuda/moe_cuda.h"
#include "runtime/kernels/moe_capacity.h"
#include "runtime/kernels/moe_padded.h"
#include "runtime/kernels/moe_padded_check.h"
#include "runtime/kernels/moe_router.h"

namespace dhelix::cuda {
namespace {

__device__ inline float f32(bf16 value) { return __bfloat162float(value); }

// Top-k and softmax of token t's logits, and the full softmax (moe_router.h).
__global__ void moe_topk_kernel(MoeDeviceShape s, const bf16* logits, MoeDeviceRouting r) {
  float z[kMaxMoeExperts];
  for (int64_t t = detail::global_thread(); t < s.tokens; t += detail::grid_threads()) {
    for (int64_t e = 0; e < s.experts; ++e) z[e] = f32(logits[t * s.experts + e]);
    kernels::router_topk_row(s.experts, s.top_k, z, r.chosen + t * s.top_k, r.gate + t * s.top_k);
    kernels::router_softmax_row(s.experts, z, r.probs + t * s.experts);
  }
}

// Per expert: n_e, the assignments routed to it before dropping.
__global__ void moe_routed_kernel(MoeDeviceShape s, MoeDeviceRouting r) {
  const int64_t n = s.tokens * s.top_k;
  for (int64_t e = detail::global_thread(); e < s.experts; e += detail::grid_threads()) {
    int64_t routed = 0;
    for (int64_t a = 0; a < n; ++a) routed += r.chosen[a] == e ? 1 : 0;
    r.routed[e] = routed;
  }
}

// Whether assignment a fits its expert's capacity (moe_capacity.h), after every n_e is
// written: O(1) for an expert within its capacity, O(T k) for one over it.
__global__ void moe_keep_kernel(MoeDeviceShape s, MoeDeviceRouting r) {
  const int64_t n = s.tokens * s.top_k;
  for (int64_t a = detail::global_thread(); a < n; a += detail::grid_threads()) {
    r.kept[a] = kernels::keeps_assignment(n, r.chosen, r.gate, r.routed, s.capacity, a) ? 1 : 0;
  }
}

// Per expert, after every kept flag is written: its assignments' padded rows in index order
// (moe_padded.h) and its kept rows' element count.
__global__ void moe_rows_kernel(MoeDeviceShape s, MoeDeviceRouting r) {
  const int64_t n = s.tokens * s.top_k;
  for (int64_t e = detail::global_thread(); e < s.experts; e += detail::grid_threads()) {
    const int64_t kept = kernels::assign_padded_rows(n, r.chosen, r.kept, s.capacity, e, r.row);
    r.send_counts[e] = kept * s.hidden;
  }
}

// L_aux in moe_capacity.h's order, on one thread (a fixed order; E T additions).
__global__ void moe_aux_loss_kernel(MoeDeviceShape s, MoeDeviceRouting r) {
  if (detail::global_thread() != 0) return;
  *r.aux_loss = kernels::load_balancing_loss(s.tokens, s.top_k, s.experts, s.aux_loss_coeff,
                                             r.probs, r.routed);
}

__global__ void moe_permute_kernel(MoeDeviceShape s, MoeDeviceRouting r, const bf16* x,
                                   bf16* permuted) {
  const int64_t n = s.tokens * s.top_k * s.hidden;
  for (int64_t idx = detail::global_thread(); idx < n; idx += detail::grid_threads()) {
    const int64_t a = idx / s.hidden, i = idx % s.hidden;
    const int64_t row = r.row[a];
    if (row >= 0) permuted[row * s.hidden + i] = x[(a / s.top_k) * s.hidden + i];
  }
}

__global__ void moe_regroup_kernel(int64_t ep, int64_t local, int64_t capacity, int64_t hidden,
                                   const bf16* from, bf16* to, bool to_expert) {
  const int64_t n = ep * local * capacity * hidden;
  for (int64_t idx = detail::global_thread(); idx < n; idx += detail::grid_threads()) {
    const int64_t row = idx / hidden, i = idx % hidden;
    to[kernels::padded_regroup_row(row, ep, local, capacity, to_expert) * hidden + i] = from[idx];
  }
}

__global__ void moe_unpermute_kernel(MoeDeviceShape s, MoeDeviceRouting r, const bf16* expert_out,
                                     bf16* y) {
  const int64_t n = s.tokens * s.hidden;
  for (int64_t idx = detail::global_thread(); idx < n; idx += detail::grid_threads()) {
    const int64_t t = idx / s.hidden, i = idx % s.hidden;
    float sum = 0.0f;
    for (int64_t j = 0; j < s.top_k; ++j) {
      const int64_t row = r.row[t * s.top_k + j];
      if (row >= 0) sum += r.gate[t * s.top_k + j] * f32(expert_out[row * s.hidden + i]);
    }
    y[idx] = __float2bfloat16_rn(sum);
  }
}

__global__ void moe_unpermute_grad_kernel(MoeDeviceShape s, MoeDeviceRouting r, const bf16* dy,
                                          bf16* d_expert_out) {
  const int64_t n = s.tokens * s.top_k * s.hidden;
  for (int64_t idx = detail::global_thread(); idx < n; idx += detail::grid_threads()) {
    const int64_t a = idx / s.hidden, i = idx % s.hidden;
    const int64_t row = r.row[a];
    if (row >= 0) {
      d_expert_out[row * s.hidden + i] =
          __float2bfloat16_rn(r.gate[a] * f32(dy[(a / s.top_k) * s.hidden + i]));
    }
  }
}

// dgate[a] = <dy_t, expert_out[row]>, summed in element order as the CPU does.
__global__ void moe_dgate_kernel(MoeDeviceShape s, MoeDeviceRouting r, const bf16* dy,
                                 const bf16* expert_out, float* dgate) {
  const int64_t n = s.tokens * s.top_k;
  for (int64_t a = detail::global_thread(); a < n; a += detail::grid_threads()) {
    const int64_t row = r.row[a];
    float dot = 0.0f;
    if (row >= 0) {
      const bf16* g_row = dy + (a / s.top_k) * s.hidden;
      for (int64_t i = 0; i < s.hidden; ++i)
        dot += f32(g_row[i]) * f32(expert_out[row * s.hidden + i]);
    }
    dgate[a] = dot;
  }
}

__global__ void moe_permute_grad_kernel(MoeDeviceShape s, MoeDeviceRouting r,
                                        const bf16* d_permuted, bf16* dx) {
  const int64_t n = s.tokens * s.hidden;
  for (int64_t idx = detail::global_thread(); idx < n; idx += detail::grid_threads()) {
    const int64_t t = idx / s.hidden, i = idx % s.hidden;
    float sum = 0.0f;
    for (int64_t j = 0; j < s.top_k; ++j) {
      const int64_t row = r.row[t * s.top_k + j];
      if (row >= 0) sum += f32(d_permuted[row * s.hidden + i]);
    }
    dx[idx] = __float2bfloat16_rn(sum);
  }
}

__global__ void moe_router_grad_kernel(MoeDeviceShape s, MoeDeviceRouting r, const float* dgate,
                                       float aux_dloss, bf16* dz) {
  float dp[kMaxMoeExperts];
  float row[kMaxMoeExperts];
  const bool aux = s.aux_loss_coeff > 0.0 && aux_dloss != 0.0f;
  if (aux) {
    kernels::load_balancing_gradient(s.tokens, s.top_k, s.experts, s.aux_loss_coeff, r.routed,
                                     aux_dloss, dp);
  }
  for (int64_t t = detail::global_thread(); t < s.tokens; t += detail::grid_threads()) {
    kernels::router_backward_row(s.experts, s.top_k, r.chosen + t * s.top_k, r.gate + t * s.top_k,
                                 dgate + t * s.top_k, r.probs + t * s.experts, aux ? dp : nullptr,
                                 row);
    for (int64_t e = 0; e < s.experts; ++e) dz[t * s.experts + e] = __float2bfloat16_rn(row[e]);
  }
}

}  // namespace

void check_moe_shape(const MoeDeviceShape& shape) {
  kernels::check_padded_moe_shape(shape, "MoE on the cuda backend", kMaxMoeExperts);
}

std::vector<KernelEntry> moe_kernels() {
  return {{"moe_topk_kernel", reinterpret_cast<const void*>(&moe_topk_kernel)},
          {"moe_routed_kernel", reinterpret_cast<const void*>(&moe_routed_kernel)},
          {"moe_keep_kernel", reinterpret_cast<const void*>(&moe_keep_kernel)},
          {"moe_rows_kernel", reinterpret_cast<const void*>(&moe_rows_kernel)},
          {"moe_aux_loss_kernel", reinterpret_cast<const void*>(&moe_aux_loss_kernel)},
          {"moe_permute_kernel", reinterpret_cast<const void*>(&moe_permute_kernel)},
          {"moe_regroup_kernel", reinterpret_cast<const void*>(&moe_regroup_kernel)},
          {"moe_unpermute_kernel", reinterpret_cast<const void*>(&moe_unpermute_kernel)},
          {"moe_unpermute_grad_kernel", reinterpret_cast<const void*>(&moe_unpermute_grad_kernel)},
          {"moe_dgate_kernel", reinterpret_cast<const void*>(&moe_dgate_kernel)},
          {"moe_permute_grad_kernel", reinterpret_cast<const void*>(&moe_permute_grad_kernel)},
          {"moe_router_grad_kernel", reinterpret_cast<const void*>(&moe_router_grad_kernel)}};
}

void moe_route(const MoeDeviceShape& shape, const bf16* logits, MoeDeviceRouting routing,
               cudaStream_t stream) {
  check_moe_shape(shape);
  const int64_t assignments = shape.tokens * shape.top_k;
  detail::launch_per_item(shape.tokens, stream, moe_topk_kernel, shape, logits, routing);
  detail::launch_per_item(shape.experts, stream, moe_routed_kernel, shape, routing);
  detail::launch_per_item(assignments, stream, moe_keep_kernel, shape, routing);
  detail::launch_per_item(shape.experts, stream, moe_rows_kernel, shape, routing);
  detail::launch_per_item(1, stream, moe_aux_loss_kernel, shape, routing);
}

void moe_permute(const MoeDeviceShape& shape, MoeDeviceRouting routing, const bf16* x,
                 bf16* permuted, cudaStream_t stream) {
  const int64_t rows = kernels::padded_rows(shape.experts, shape.capacity);
  DHELIX_CUDA(cudaMemsetAsync(permuted, 0, static_cast<size_t>(rows * shape.hidden) * sizeof(bf16),
                              stream));
  detail::launch_per_item(shape.tokens * shape.top_k * shape.hidden, stream, moe_permute_kernel,
                          shape, routing, x, permuted);
}

void moe_regroup(int64_t ep, int64_t local, int64_t capacity, int64_t hidden, const bf16* from,
                 bf16* to, bool to_expert, cudaStream_t stream) {
  DHELIX_CHECK(from != to);
  detail::launch_per_item(ep * local * capacity * hidden, stream, moe_regroup_kernel, ep, local,
                          capacity, hidden, from, to, to_expert);
}

void moe_unpermute(const MoeDeviceShape& shape, MoeDeviceRouting routing, const bf16* expert_out,
                   bf16* y, cudaStream_t stream) {
  detail::launch_per_item(shape.tokens * shape.hidden, stream, moe_unpermute_kernel, shape, routing,
                          expert_out, y);
}

void moe_unpermute_backward(const MoeDeviceShape& shape, MoeDeviceRouting routing, const bf16* dy,
                            const bf16* expert_out, bf16* d_expert_out, float* dgate,
                            cudaStream_t stream) {
  const int64_t rows = kernels::padded_rows(shape.experts, shape.capacity);
  DHELIX_CUDA(cudaMemsetAsync(d_expert_out, 0,
                              static_cast<size_t>(rows * shape.hidden) * sizeof(bf16), stream));
  detail::launch_per_item(shape.tokens * shape.top_k * shape.hidden, stream,
                          moe_unpermute_grad_kernel, shape, routing, dy, d_expert_out);
  detail::launch_per_item(shape.tokens * shape.top_k, stream, moe_dgate_kernel, shape, routing, dy,
                          expert_out, dgate);
}

void moe_permute_backward(const MoeDeviceShape& shape, MoeDeviceRouting routing,
                          const bf16* d_permuted, bf16* dx, cudaStream_t stream) {
  detail::launch_per_item(shape.tokens * shape.hidden, stream, moe_permute_grad_kernel, shape,
                          routing, d_permuted, dx);
}

void moe_router_logits_backward(const MoeDeviceShape& shape, MoeDeviceRouting routing,
                                const float* dgate, float aux_dloss, bf16* dz,
                                cudaStream_t stream) {
  detail::launch_per_item(shape.tokens, stream, moe_router_grad_kernel, shape, routing, dgate,
                          aux_dloss, dz);
}

}  // namespace dhelix::cuda
