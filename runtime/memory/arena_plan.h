#pragma once
// Offsets for blocks of activation memory in one arena, computed once before the first
// step: blocks that may be in use at the same time (buffer_spans.h) get disjoint bytes,
// the others may share them.
//
// The algorithm is greedy by size with best fit (Pisarchyk and Lee 2020, "Efficient Memory
// Management for Deep Neural Net Inference", the "greedy by size" offset calculation of
// TensorFlow Lite): take the blocks largest first; place each in the smallest gap, between
// the already placed blocks it conflicts with, that holds it, else after the last of them.
// It is not optimal (packing is NP-hard), but on training programs it lands close to the
// bound below, because the blocks are few sizes repeated per micro-batch and layer:
// docs/runtime.md, "Activation memory", gives the measured ratio per example.
//
// Lower bound: at any program position, the blocks live there (first use <= position <=
// last use, in program order) all need distinct bytes, so no arena is smaller than the
// largest such sum. Blocks that overlap only in the happens-before order, not in program
// order, can make the best arena larger than this bound.
//
// Worked example, alignment 1: blocks A 4, B 3, C 2; A conflicts with B and C, B with C
// not. A -> 0 (first); B -> 4 (its one conflict, A, covers [0, 4)); C -> 4 (conflicts
// with A only: the gap after A holds it, B's bytes are shared). Arena 7 bytes.

#include <cstdint>
#include <functional>
#include <vector>

namespace dhelix::rt {

struct ArenaPlacement {
  std::vector<int64_t> offsets;  ///< per block, bytes from the arena's start
  int64_t arena_bytes = 0;       ///< the end of the furthest block
};

/// Places blocks of `bytes` (see the file comment). `conflicts(i, j)` says whether blocks i
/// and j may be in use at the same time; it must be symmetric. Every offset is a multiple
/// of `alignment` (> 0).
ArenaPlacement pack_blocks(const std::vector<int64_t>& bytes,
                           const std::function<bool(size_t, size_t)>& conflicts, int64_t alignment);

/// A block's first and last use in program order (inclusive).
struct ProgramInterval {
  int64_t first = 0;
  int64_t last = 0;
};

/// The most bytes of blocks live at one program position (the file comment's bound).
int64_t live_peak_bytes(const std::vector<int64_t>& bytes,
                        const std::vector<ProgramInterval>& intervals);

/// `value` rounded up to a multiple of `alignment` (> 0).
inline int64_t align_up(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace dhelix::rt
