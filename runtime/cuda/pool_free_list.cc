#include "runtime/cuda/pool_free_list.h"

#include <fmt/format.h>

#include <iterator>

#include "lib/error.h"

namespace dhelix::cuda {

PoolFreeList::PoolFreeList(int64_t alignment_bytes) : alignment_(alignment_bytes) {
  DHELIX_CHECK(alignment_ > 0 && (alignment_ & (alignment_ - 1)) == 0);
}

int64_t PoolFreeList::rounded(int64_t bytes) const {
  return (bytes + alignment_ - 1) / alignment_ * alignment_;
}

void PoolFreeList::add_slab(uint64_t base, int64_t bytes) {
  DHELIX_CHECK(bytes > 0 && bytes % alignment_ == 0);
  DHELIX_CHECK(base % static_cast<uint64_t>(alignment_) == 0);
  const uint64_t end = base + static_cast<uint64_t>(bytes);
  auto next = slab_ends_.lower_bound(base);
  DHELIX_CHECK_MSG(next == slab_ends_.end() || next->first >= end, "slabs overlap");
  if (next != slab_ends_.begin()) {
    DHELIX_CHECK_MSG(static_cast<uint64_t>(std::prev(next)->second) <= base, "slabs overlap");
  }
  slab_ends_[base] = static_cast<int64_t>(end);
  insert_free(base, Block{bytes, next_slab_++});
  bytes_reserved_ += bytes;
}

std::optional<uint64_t> PoolFreeList::allocate(int64_t bytes) {
  DHELIX_CHECK(bytes > 0);
  const int64_t size = rounded(bytes);
  auto fit = free_by_size_.lower_bound({size, 0});
  if (fit == free_by_size_.end()) return std::nullopt;
  const uint64_t address = fit->second;
  auto it = free_by_address_.find(address);
  const Block block = it->second;
  erase_free(it);
  if (block.bytes > size) {
    insert_free(address + static_cast<uint64_t>(size), Block{block.bytes - size, block.slab});
  }
  used_[address] = Block{size, block.slab};
  bytes_in_use_ += size;
  return address;
}

void PoolFreeList::release(uint64_t address) {
  auto used = used_.find(address);
  if (used == used_.end()) {
    throw Error(
        ErrorCode::kInternal,
        fmt::format("device pool: release of 0x{:x}, which is not a live allocation", address));
  }
  Block block = used->second;
  used_.erase(used);
  bytes_in_use_ -= block.bytes;
  uint64_t start = address;
  auto after = free_by_address_.find(address + static_cast<uint64_t>(block.bytes));
  if (after != free_by_address_.end() && after->second.slab == block.slab) {
    block.bytes += after->second.bytes;
    erase_free(after);
  }
  auto before = free_by_address_.lower_bound(address);
  if (before != free_by_address_.begin()) {
    --before;
    if (before->second.slab == block.slab &&
        before->first + static_cast<uint64_t>(before->second.bytes) == address) {
      start = before->first;
      block.bytes += before->second.bytes;
      erase_free(before);
    }
  }
  insert_free(start, block);
}

int64_t PoolFreeList::largest_free_bytes() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

void PoolFreeList::insert_free(uint64_t address, Block block) {
  free_by_address_[address] = block;
  free_by_size_.insert({block.bytes, address});
}

void PoolFreeList::erase_free(std::map<uint64_t, Block>::iterator it) {
  free_by_size_.erase({it->second.bytes, it->first});
  free_by_address_.erase(it);
}

}  // namespace dhelix::cuda
