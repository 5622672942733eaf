#include "runtime/cuda/pool_free_list.h"

#include <gtest/gtest.h>

#include "lib/error.h"

namespace dhelix::cuda {
namespace {

// The example of the header comment.
TEST(PoolFreeList, HeaderExampleSplitsAndMergesBack) {
  PoolFreeList list;
  list.add_slab(0x1000, 1024);
  EXPECT_EQ(list.allocate(100), 0x1000u);
  EXPECT_EQ(list.allocate(300), 0x1100u);
  EXPECT_EQ(list.bytes_in_use(), 256 + 512);
  EXPECT_EQ(list.free_blocks(), 1);  // 0x1300 + 256
  list.release(0x1000);
  EXPECT_EQ(list.free_blocks(), 2);
  list.release(0x1100);
  EXPECT_EQ(list.free_blocks(), 1);
  EXPECT_EQ(list.largest_free_bytes(), 1024);
  EXPECT_EQ(list.bytes_in_use(), 0);
  EXPECT_EQ(list.bytes_reserved(), 1024);
}

TEST(PoolFreeList, RoundsToTheAlignment) {
  PoolFreeList list;
  EXPECT_EQ(list.rounded(1), 256);
  EXPECT_EQ(list.rounded(256), 256);
  EXPECT_EQ(list.rounded(257), 512);
  PoolFreeList small(16);
  EXPECT_EQ(small.rounded(17), 32);
}

TEST(PoolFreeList, BestFitPicksTheSmallestHoleThenTheLowestAddress) {
  PoolFreeList list;
  list.add_slab(0, 4096);
  const uint64_t a = *list.allocate(512);   // 0
  const uint64_t b = *list.allocate(256);   // 512
  const uint64_t c = *list.allocate(1024);  // 768
  const uint64_t d = *list.allocate(256);   // 1792
  EXPECT_EQ(d, 1792u);
  list.release(a);                       // hole of 512 at 0
  list.release(c);                       // hole of 1024 at 768; tail 2048 + 2048 free
  EXPECT_EQ(list.allocate(300), 0u);     // 512 fits best
  EXPECT_EQ(list.allocate(600), 768u);   // the 1024 hole, not the tail
  EXPECT_EQ(list.allocate(256), 1536u);  // what is left of that hole
  static_cast<void>(b);
}

TEST(PoolFreeList, MergesBothNeighboursButNeverAcrossSlabs) {
  PoolFreeList list;
  list.add_slab(0, 512);
  list.add_slab(512, 512);                       // adjacent, but a separate cudaMalloc
  EXPECT_EQ(list.allocate(1024), std::nullopt);  // no block spans both slabs
  const uint64_t a = *list.allocate(256);
  const uint64_t b = *list.allocate(256);
  const uint64_t c = *list.allocate(256);
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 256u);
  EXPECT_EQ(c, 512u);
  list.release(a);
  list.release(c);
  list.release(b);  // merges with a's hole; c's slab stays separate
  EXPECT_EQ(list.free_blocks(), 2);
  EXPECT_EQ(list.largest_free_bytes(), 512);
  EXPECT_EQ(list.live_allocations(), 0);
}

TEST(PoolFreeList, FullPoolAnswersNothing) {
  PoolFreeList list;
  EXPECT_EQ(list.allocate(1), std::nullopt);
  list.add_slab(0x10000, 512);
  EXPECT_EQ(list.allocate(512), 0x10000u);
  EXPECT_EQ(list.allocate(1), std::nullopt);
  EXPECT_EQ(list.largest_free_bytes(), 0);
}

TEST(PoolFreeList, ReleaseOfAnUnknownAddressThrows) {
  PoolFreeList list;
  list.add_slab(0x1000, 1024);
  const uint64_t a = *list.allocate(10);
  list.release(a);
  try {
    list.release(a);
    FAIL() << "double release accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInternal);
    EXPECT_STREQ(error.what(), "device pool: release of 0x1000, which is not a live allocation");
  }
  EXPECT_THROW(list.release(0x1100), Error);
}

}  // namespace
}  // namespace dhelix::cuda
