#pragma once
// The bookkeeping of the device memory pool (device_pool.h), as plain host C++ over
// integer addresses so that it is tested on the CPU with made-up ones.
//
// Memory comes in slabs (one cudaMalloc each). Every allocation is rounded up to the
// alignment (256 bytes: what cudaMalloc guarantees, and enough for any vector load) and
// carved best-fit out of a free block; freeing a block merges it with its free neighbours
// in the same slab, never across slabs (two slabs that happen to be adjacent are still two
// cudaMallocs). Example with one slab [0x1000, 0x1000 + 1024):
//   allocate(100) -> 0x1000 (256 bytes), allocate(300) -> 0x1100 (512 bytes),
//   release(0x1000): free blocks 0x1000+256 and 0x1300+256; release(0x1100): one free
//   block 0x1000+1024 again.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace dhelix::cuda {

/// Alignment of every pool allocation, bytes.
inline constexpr int64_t kPoolAlignmentBytes = 256;

class PoolFreeList {
 public:
  /// alignment_bytes is a power of two.
  explicit PoolFreeList(int64_t alignment_bytes = kPoolAlignmentBytes);

  /// Adds slab [base, base + bytes) as one free block. base must be aligned and bytes a
  /// positive multiple of the alignment; the slab must not overlap another.
  void add_slab(uint64_t base, int64_t bytes);
  /// The smallest free block that fits `bytes` (> 0) rounded up to the alignment, split;
  /// lowest address among equal sizes. nullopt when no block fits (the pool then adds a slab).
  std::optional<uint64_t> allocate(int64_t bytes);
  /// Frees an allocation and merges it with free neighbours of its slab. Throws
  /// Error(kInternal) naming the address when it is not a live allocation.
  void release(uint64_t address);

  /// bytes rounded up to the alignment.
  int64_t rounded(int64_t bytes) const;
  int64_t bytes_in_use() const { return bytes_in_use_; }
  int64_t bytes_reserved() const { return bytes_reserved_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_by_address_.size()); }
  int64_t live_allocations() const { return static_cast<int64_t>(used_.size()); }
  /// The largest single allocation that would succeed without a new slab (0 when none).
  int64_t largest_free_bytes() const;

 private:
  struct Block {
    int64_t bytes = 0;
    int64_t slab = 0;  // merging stays inside one slab
  };
  void insert_free(uint64_t address, Block block);
  void erase_free(std::map<uint64_t, Block>::iterator it);

  int64_t alignment_;
  int64_t next_slab_ = 0;
  int64_t bytes_in_use_ = 0;
  int64_t bytes_reserved_ = 0;
  std::map<uint64_t, Block> free_by_address_;
  std::set<std::pair<int64_t, uint64_t>> free_by_size_;  // (bytes, address)
  std::map<uint64_t, Block> used_;
  std::map<uint64_t, int64_t> slab_ends_;  // base -> end, to refuse overlaps
};

}  // namespace dhelix::cuda
