// The shared expert's gate kernels (moe_shared_cuda.h): one thread per element, or a warp
// per row for the dot product of the backward; the math is runtime/kernels/moe_shared_gate.h's.

#include <cuda_bf16.h>

#include "lib/error.h"
#include "runtime/cuda/launch_util.cuh"
#include "runtime/cuda/moe_shared_cuda.h"
#include "runtime/kernels/moe_shared_gate.h"

namespace dhelix::cuda {
namespace {

__device__ inline float f32(bf16 value) { return __bfloat162float(value); }

__global__ void moe_shared_gate_kernel(int64_t rows, const bf16* logit, float* gate) {
  for (int64_t r = detail::global_thread(); r < rows; r += detail::grid_threads()) {
    gate[r] = kernels::shared_gate(f32(logit[r]));
  }
}

__global__ void moe_shared_gate_add_kernel(int64_t rows, int64_t hidden, const float* gate,
                                           const bf16* out, bf16* y) {
  const int64_t n = rows * hidden;
  for (int64_t idx = detail::global_thread(); idx < n; idx += detail::grid_threads()) {
    y[idx] = __float2bfloat16_rn(
        kernels::shared_gate_add(f32(y[idx]), gate[idx / hidden], f32(out[idx])));
  }
}

__global__ void moe_shared_gate_scale_kernel(int64_t rows, int64_t hidden, const float* gate,
                                             const bf16* dy, bf16* d_out) {
  const int64_t n = rows * hidden;
  for (int64_t idx = detail::global_thread(); idx < n; idx += detail::grid_threads()) {
    d_out[idx] = __float2bfloat16_rn(kernels::shared_gate_scale(gate[idx / hidden], f32(dy[idx])));
  }
}

// A warp per row: <dy_r, out_r> with lane-strided coalesced loads, summed in
// kernels::lane_tree_sum's order (the host twin's, moe_padded_cpu.cc).
__global__ void moe_shared_dlogit_kernel(int64_t rows, int64_t hidden, const float* gate,
                                         const bf16* dy, const bf16* out, bf16* d_logit) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  for (int64_t r = detail::global_thread() / kWarpSize; r < rows;
       r += detail::grid_threads() / kWarpSize) {
    const bf16* dy_row = dy + r * hidden;
    const bf16* out_row = out + r * hidden;
    float partial = 0.0f;
    for (int64_t i = lane; i < hidden; i += kWarpSize) partial += f32(dy_row[i]) * f32(out_row[i]);
    const float dot = detail::warp_lane_tree_sum(partial);
    if (lane == 0)
      d_logit[r] = __float2bfloat16_rn(kernels::shared_gate_dlogit_of_dot(dot, gate[r]));
  }
}

}  // namespace

std::vector<KernelEntry> moe_shared_kernels() {
  return {
      {"moe_shared_gate_kernel", reinterpret_cast<const void*>(&moe_shared_gate_kernel)},
      {"moe_shared_gate_add_kernel", reinterpret_cast<const void*>(&moe_shared_gate_add_kernel)},
      {"moe_shared_gate_scale_kernel",
       reinterpret_cast<const void*>(&moe_shared_gate_scale_kernel)},
      {"moe_shared_dlogit_kernel", reinterpret_cast<const void*>(&moe_shared_dlogit_kernel)}};
}

void moe_shared_gate(int64_t rows, const bf16* logit, float* gate, cudaStream_t stream) {
  detail::launch_per_item(rows, stream, moe_shared_gate_kernel, rows, logit, gate);
}

void moe_shared_gate_add(int64_t rows, int64_t hidden, const float* gate, const bf16* out, bf16* y,
                         cudaStream_t stream) {
  detail::launch_per_item(rows * hidden, stream, moe_shared_gate_add_kernel, rows, hidden, gate,
                          out, y);
}

void moe_shared_gate_scale(int64_t rows, int64_t hidden, const float* gate, const bf16* dy,
                           bf16* d_out, cudaStream_t stream) {
  DHELIX_CHECK(dy != d_out);
  detail::launch_per_item(rows * hidden, stream, moe_shared_gate_scale_kernel, rows, hidden, gate,
                          dy, d_out);
}

void moe_shared_gate_backward(int64_t rows, int64_t hidden, const float* gate, const bf16* dy,
                              const bf16* out, bf16* d_logit, bf16* d_out, cudaStream_t stream) {
  detail::launch(warp_per_row_launch(rows), stream, moe_shared_dlogit_kernel, rows, hidden, gate,
                 dy, out, d_logit);
  moe_shared_gate_scale(rows, hidden, gate, dy, d_out, stream);
}

}  // namespace dhelix::cuda
