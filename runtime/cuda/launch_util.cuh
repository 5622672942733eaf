#pragma once
// What the two kernel files share: the launch shape as a dim3, the grid-stride index and
// the warp reduction in kernels::lane_tree_sum's order. Device code only (.cu files).

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/launch_config.h"

namespace dhelix::cuda::detail {

inline dim3 to_dim3(Dim3 d) {
  return dim3(static_cast<unsigned>(d.x), static_cast<unsigned>(d.y), static_cast<unsigned>(d.z));
}

/// First item of this thread and the stride of a grid-stride loop over a 1-D grid.
__device__ inline int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

/// Each lane holds its strided partial sum (elements lane, lane + 32, ...); returns the
/// total on every lane. Shuffling down by 16, 8, 4, 2, 1 adds partial[l + offset] into
/// partial[l] for l < offset: exactly the halving tree of kernels::lane_tree_sum.
__device__ inline float warp_lane_tree_sum(float partial) {
  for (int offset = 16; offset > 0; offset /= 2) {
    partial += __shfl_down_sync(0xffffffffu, partial, offset);
  }
  return __shfl_sync(0xffffffffu, partial, 0);
}

/// The largest value over the warp's lanes (exact, so any order gives the same result).
__device__ inline float warp_max(float value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    float other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = value > other ? value : other;
  }
  return value;
}

}  // namespace dhelix::cuda::detail

/// Checks the launch just made (a bad configuration is reported here, asynchronously
/// failing kernels at the next synchronising call).
#define DHELIX_CUDA_LAUNCHED() DHELIX_CUDA(cudaGetLastError())
