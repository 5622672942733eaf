#pragma once
// Device memory for one rank: a pool that grows by cudaMalloc of big slabs and carves
// allocations out of them with a host-side free list (pool_free_list.h), 256-byte aligned.
//
// Why not cudaMallocAsync or the caching allocators of the frameworks: DHelix runs two
// strands' work on several streams at once, and a caching allocator that lets each stream
// reuse memory freed by another must track cross-stream use (PyTorch's recordStream) or
// risk handing out memory still being read. Here every allocation and every release is
// ordered on ONE stream, the pool's (the paper's advice): a block released on
// the host becomes reusable for work that is enqueued later, and stream order makes that
// safe provided every use of the block on another stream has been made to precede the
// release on the pool stream (an event the pool stream waits on; runtime/exec/
// stream_lowering.h produces exactly such waits). release() never synchronises the host.
// The DHelix paper's implementation section gives the reason: letting "different CUDA
// streams ... independently allocate and release memory ... can lead to fragmentation and
// out-of-memory errors", so DHelix allocates and frees on one stream only.
//
// Growth: a slab is max(slab_bytes, the rounded request) and costs a cudaMalloc, which may
// synchronise the device. The runtime allocates while binding a rank program, before the
// iteration starts, and then calls set_growth_allowed(false): an allocation that would
// grow the pool inside an iteration then throws instead of stalling every stream.

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "runtime/cuda/pool_free_list.h"

namespace dhelix::cuda {

/// Default slab size: 256 MiB (few cudaMallocs, little waste at the tail of a slab).
inline constexpr int64_t kDefaultSlabBytes = int64_t{256} << 20;

class DevicePool {
 public:
  /// A pool on the current device whose allocations are ordered on `stream`.
  explicit DevicePool(cudaStream_t stream, int64_t slab_bytes = kDefaultSlabBytes);
  /// Frees every slab (cudaFree synchronises; the pool outlives the work using it).
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  /// bytes (> 0) of device memory, 256-byte aligned. Throws Error(kInternal) when the pool
  /// would have to grow and growth is not allowed, or when cudaMalloc fails (the message
  /// gives the pool's bytes in use and reserved).
  void* allocate(int64_t bytes);
  /// count elements of T.
  template <class T>
  T* allocate_array(int64_t count) {
    return static_cast<T*>(allocate(count * static_cast<int64_t>(sizeof(T))));
  }
  /// Returns a block (see the file comment for when that is safe). Throws Error(kInternal)
  /// for a pointer the pool did not hand out.
  void release(void* pointer);

  void set_growth_allowed(bool allowed) { growth_allowed_ = allowed; }
  cudaStream_t stream() const { return stream_; }
  int64_t bytes_in_use() const { return free_list_.bytes_in_use(); }
  int64_t bytes_reserved() const { return free_list_.bytes_reserved(); }
  int64_t slabs() const { return static_cast<int64_t>(slabs_.size()); }

 private:
  cudaStream_t stream_;
  int64_t slab_bytes_;
  bool growth_allowed_ = true;
  PoolFreeList free_list_;
  std::vector<void*> slabs_;
};

}  // namespace dhelix::cuda
