#include "runtime/cuda/device_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "lib/error.h"
#include "tests/gpu/gpu_test_util.h"

namespace dhelix::cuda {
namespace {

TEST(DevicePool, GrowsBySlabsAndReusesFreedBlocks) {
  DHELIX_REQUIRE_GPUS(1);
  DevicePool pool(nullptr, 1 << 20);
  void* a = pool.allocate(1000);
  void* b = pool.allocate(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % kPoolAlignmentBytes, 0u);
  EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), 1024);
  EXPECT_EQ(pool.slabs(), 1);
  void* big = pool.allocate(3 << 20);  // larger than a slab: a slab of its own size
  EXPECT_EQ(pool.slabs(), 2);
  EXPECT_EQ(pool.bytes_reserved(), (1 << 20) + (3 << 20));
  DHELIX_CUDA(cudaMemset(big, 0, 3 << 20));  // the memory is real
  pool.release(a);
  EXPECT_EQ(pool.allocate(512), a);
  DHELIX_CUDA(cudaDeviceSynchronize());
}

TEST(DevicePool, RefusesToGrowInsideAnIteration) {
  DHELIX_REQUIRE_GPUS(1);
  DevicePool pool(nullptr, 1 << 20);
  pool.allocate(1 << 20);
  pool.set_growth_allowed(false);
  try {
    pool.allocate(256);
    FAIL() << "grew inside an iteration";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(),
                 "device pool: 256 bytes requested inside an iteration, but only 0 "
                 "bytes are free in one block (1048576 in use of 1048576 reserved)");
  }
}

}  // namespace
}  // namespace dhelix::cuda
