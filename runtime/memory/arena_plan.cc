#include "runtime/memory/arena_plan.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "lib/error.h"

namespace dhelix::rt {

ArenaPlacement pack_blocks(const std::vector<int64_t>& bytes,
                           const std::function<bool(size_t, size_t)>& conflicts,
                           int64_t alignment) {
  DHELIX_CHECK(alignment > 0);
  const size_t n = bytes.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  // Largest first; equal sizes in block order, so the plan is the same on every run.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  ArenaPlacement placement;
  placement.offsets.assign(n, -1);
  std::vector<size_t> placed;
  std::vector<std::pair<int64_t, int64_t>> taken;  // [begin, end) of placed conflicting blocks
  for (const size_t block : order) {
    const int64_t size = align_up(std::max<int64_t>(bytes[block], 1), alignment);
    taken.clear();
    for (const size_t other : placed) {
      if (conflicts(block, other)) {
        const int64_t begin = placement.offsets[other];
        taken.emplace_back(begin, begin + align_up(std::max<int64_t>(bytes[other], 1), alignment));
      }
    }
    std::sort(taken.begin(), taken.end());
    // Best fit: the smallest gap that holds the block; else after the furthest end.
    int64_t best = -1;
    int64_t best_gap = std::numeric_limits<int64_t>::max();
    int64_t cursor = 0;
    for (const auto& [begin, end] : taken) {
      const int64_t gap = begin - cursor;
      if (gap >= size && gap < best_gap) {
        best = cursor;
        best_gap = gap;
      }
      cursor = std::max(cursor, end);
    }
    placement.offsets[block] = best >= 0 ? best : cursor;
    placement.arena_bytes = std::max(placement.arena_bytes, placement.offsets[block] + size);
    placed.push_back(block);
  }
  return placement;
}

int64_t live_peak_bytes(const std::vector<int64_t>& bytes,
                        const std::vector<ProgramInterval>& intervals) {
  DHELIX_CHECK(bytes.size() == intervals.size());
  // +bytes at first, -bytes after last; at equal positions the starts count first.
  std::vector<std::pair<int64_t, int64_t>> events;
  for (size_t i = 0; i < bytes.size(); ++i) {
    events.emplace_back(2 * intervals[i].first, bytes[i]);
    events.emplace_back(2 * intervals[i].last + 1, -bytes[i]);
  }
  std::sort(events.begin(), events.end());
  int64_t live = 0;
  int64_t peak = 0;
  for (const auto& [position, delta] : events) {
    live += delta;
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace dhelix::rt
