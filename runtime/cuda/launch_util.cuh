#pragma once
// What the kernel files share: the launch itself, the launch shape as a dim3, the
// grid-stride index and the warp reduction in kernels::lane_tree_sum's order. Device code
// only (.cu files).

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/launch_config.h"

/// Checks the launch just made (a bad configuration is reported here, asynchronously
/// failing kernels at the next synchronising call).
#define DHELIX_CUDA_LAUNCHED() DHELIX_CUDA(cudaGetLastError())

namespace dhelix::cuda::detail {

inline dim3 to_dim3(Dim3 d) {
  return dim3(static_cast<unsigned>(d.x), static_cast<unsigned>(d.y), static_cast<unsigned>(d.z));
}

/// Launches `kernel` with `config`'s grid, block and dynamic shared memory (at most the
/// 48 KiB that need no opt-in) on `stream`, and checks the launch; nothing for an empty grid.
template <class Kernel, class... Args>
void launch(const LaunchConfig& config, cudaStream_t stream, Kernel kernel, Args... args) {
  if (config.grid.x == 0 || config.grid.y == 0 || config.grid.z == 0) return;
  kernel<<<to_dim3(config.grid), to_dim3(config.block), static_cast<size_t>(config.shared_bytes),
           stream>>>(args...);
  DHELIX_CUDA_LAUNCHED();
}

/// As launch(), for kernels whose dynamic shared memory may pass 48 KiB: the kernel opts in
/// first (cudaFuncSetAttribute, a host-side attribute, no synchronisation).
template <class Kernel, class... Args>
void launch_with_large_shared(const LaunchConfig& config, cudaStream_t stream, Kernel kernel,
                              Args... args) {
  if (config.grid.x == 0 || config.grid.y == 0 || config.grid.z == 0) return;
  if (config.shared_bytes > 0) {
    DHELIX_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(config.shared_bytes)));
  }
  kernel<<<to_dim3(config.grid), to_dim3(config.block), static_cast<size_t>(config.shared_bytes),
           stream>>>(args...);
  DHELIX_CUDA_LAUNCHED();
}

/// One thread per item (thread_per_item_launch), as launch().
template <class Kernel, class... Args>
void launch_per_item(int64_t items, cudaStream_t stream, Kernel kernel, Args... args) {
  launch(thread_per_item_launch(items), stream, kernel, args...);
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
