#include "runtime/cuda/device_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "lib/error.h"
#include "runtime/cuda/cuda_check.h"

namespace dhelix::cuda {

DevicePool::DevicePool(cudaStream_t stream, int64_t slab_bytes)
    : stream_(stream), slab_bytes_(slab_bytes) {
  DHELIX_CHECK(slab_bytes_ > 0 && slab_bytes_ % kPoolAlignmentBytes == 0);
}

DevicePool::~DevicePool() {
  // A destructor must not throw; a failing cudaFree at shutdown has nobody left to tell.
  for (void* slab : slabs_) static_cast<void>(cudaFree(slab));
}

void* DevicePool::allocate(int64_t bytes) {
  DHELIX_CHECK(bytes > 0);
  if (std::optional<uint64_t> address = free_list_.allocate(bytes)) {
    return reinterpret_cast<void*>(static_cast<uintptr_t>(*address));
  }
  const int64_t grow = std::max(slab_bytes_, free_list_.rounded(bytes));
  if (!growth_allowed_) {
    throw Error(
        ErrorCode::kInternal,
        fmt::format("device pool: {} bytes requested inside an iteration, but only {} "
                    "bytes are free in one block ({} in use of {} reserved)",
                    bytes, free_list_.largest_free_bytes(), bytes_in_use(), bytes_reserved()));
  }
  void* slab = nullptr;
  try {
    DHELIX_CUDA(cudaMalloc(&slab, static_cast<size_t>(grow)));
  } catch (const Error& error) {
    throw Error(error.code(), fmt::format("device pool: growing by {} bytes ({} in use of {} "
                                          "reserved): {}",
                                          grow, bytes_in_use(), bytes_reserved(), error.what()));
  }
  slabs_.push_back(slab);
  free_list_.add_slab(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(slab)), grow);
  std::optional<uint64_t> address = free_list_.allocate(bytes);
  DHELIX_CHECK(address.has_value());
  return reinterpret_cast<void*>(static_cast<uintptr_t>(*address));
}

void DevicePool::release(void* pointer) {
  free_list_.release(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(pointer)));
}

}  // namespace dhelix::cuda
