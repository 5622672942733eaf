// The MoE layer's kernels (moe_cuda.h) after the routing: the padded permutation, its
// regrouping for expert parallelism, the combine, and their backward. One thread per
// output element (coalesced over h), a warp per assignment for dgate's dot product. The
// router's kernels are kernels_moe_route.cu's; the host twin is runtime/cpu/moe_padded_cpu.cc.

#include <cuda_bf16.h>

#include "lib/error.h"
#include "runtime/cuda/launch_util.cuh"
#include "runtime/cuda/moe_cuda.h"
#include "runtime/kernels/moe_padded.h"
#include "runtime/kernels/moe_padded_check.h"

namespace dhelix::cuda {
namespace {

__device__ inline float f32(bf16 value) { return __bfloat162float(value); }

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

// A warp per assignment: dgate[a] = <dy_t, expert_out[row]>, lane-strided coalesced loads
// summed in kernels::lane_tree_sum's order (the host twin's, moe_padded_cpu.cc).
__global__ void moe_dgate_kernel(MoeDeviceShape s, MoeDeviceRouting r, const bf16* dy,
                                 const bf16* expert_out, float* dgate) {
  const int64_t n = s.tokens * s.top_k;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  for (int64_t a = detail::global_thread() / kWarpSize; a < n;
       a += detail::grid_threads() / kWarpSize) {
    const int64_t row = r.row[a];
    float partial = 0.0f;
    if (row >= 0) {
      const bf16* g_row = dy + (a / s.top_k) * s.hidden;
      const bf16* o_row = expert_out + row * s.hidden;
      for (int64_t i = lane; i < s.hidden; i += kWarpSize) partial += f32(g_row[i]) * f32(o_row[i]);
    }
    const float dot = detail::warp_lane_tree_sum(partial);
    if (lane == 0) dgate[a] = dot;
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

}  // namespace

void check_moe_shape(const MoeDeviceShape& shape) {
  kernels::check_padded_moe_shape(shape, "MoE on the cuda backend", kMaxMoeExperts);
}

std::vector<KernelEntry> moe_kernels() {
  std::vector<KernelEntry> kernels = moe_route_kernels();
  for (const KernelEntry& entry :
       {KernelEntry{"moe_permute_kernel", reinterpret_cast<const void*>(&moe_permute_kernel)},
        KernelEntry{"moe_regroup_kernel", reinterpret_cast<const void*>(&moe_regroup_kernel)},
        KernelEntry{"moe_unpermute_kernel", reinterpret_cast<const void*>(&moe_unpermute_kernel)},
        KernelEntry{"moe_unpermute_grad_kernel",
                    reinterpret_cast<const void*>(&moe_unpermute_grad_kernel)},
        KernelEntry{"moe_dgate_kernel", reinterpret_cast<const void*>(&moe_dgate_kernel)},
        KernelEntry{"moe_permute_grad_kernel",
                    reinterpret_cast<const void*>(&moe_permute_grad_kernel)}}) {
    kernels.push_back(entry);
  }
  return kernels;
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
  detail::launch(warp_per_row_launch(shape.tokens * shape.top_k), stream, moe_dgate_kernel, shape,
                 routing, dy, expert_out, dgate);
}

void moe_permute_backward(const MoeDeviceShape& shape, MoeDeviceRouting routing,
                          const bf16* d_permuted, bf16* dx, cudaStream_t stream) {
  detail::launch_per_item(shape.tokens * shape.hidden, stream, moe_permute_grad_kernel, shape,
                          routing, d_permuted, dx);
}

}  // namespace dhelix::cuda
