#pragma once
// How the CUDA router (runtime/cuda/kernels_moe_route.cu) counts, places and sums without a
// serial loop, written down once for the kernels and their host twin
// (runtime/cpu/moe_route_twin.cc), which runs the same decomposition on the CPU.
//
// Counts and positions: a histogram and an exclusive scan. The T k assignments are cut
// into tiles of kMoeScanTile (one block each). Pass 1 counts each tile's assignments per
// expert (a warp's equal experts found at once with a match, its counts added per warp);
// pass 2 turns each expert's row of tile counts into an exclusive scan (one warp per
// expert, 32 tiles per step) and writes the expert's total; pass 3 gives each assignment
// its expert's offset of its tile plus its rank among the tile's earlier assignments to
// the same expert. Ascending assignment index = ascending token, the order the CPU's
// stable sort keeps, so the positions are assign_padded_rows' exactly. Run once over every
// assignment (n_e, the routed counts, before dropping), then over the kept ones (their
// padded rows and the per-expert counts the all-to-all sends).
//
// Worked example (tile 4 instead of 256): E = 3, chosen = [0 1 0 2 | 0 0 1 2 | 0 1]:
//
//   tile counts   tile 0  tile 1  tile 2   total     exclusive scan   tile 0  tile 1  tile 2
//   expert 0         2       2       1       5        expert 0           0       2       4
//   expert 1         1       1       1       3        expert 1           0       1       2
//   expert 2         1       1       0       2        expert 2           0       1       2
//
// Assignment 5 (tile 1, expert 0; assignment 4 is the tile's earlier one to expert 0) is
// expert 0's position 2 + 1 = 3: expert 0's assignments are 0, 2, 4, 5, 8.
//
// The aux loss: L = alpha E / (T^2 k) sum_{t,e} n_e p_te, the T E terms summed in double
// by blocks of kMoeAuxThreads threads, each thread kMoeAuxItemsPerThread terms strided by
// the block's width, then a halving tree in shared memory (tree_sum_pow2), one partial per
// block; a final block of kMoeAuxThreads threads sums the partials the same way. Each term
// n_e p_te is exact in double (a count times a float), so a fused multiply-add gives the
// same bits: the kernels and the twin agree bit for bit. Against load_balancing_loss (the
// serial reference, sums by expert column) the order differs: within double rounding,
// which the final float rounding almost always hides (tests: 1e-6 relative).
//
// Failure rules: none at run time; the shapes are checked before (moe_padded_check.h).

#include <cstdint>

#include "runtime/kernels/host_device.h"
#include "runtime/kernels/moe_capacity.h"

namespace dhelix::kernels {

/// Assignments per tile of the counting passes (one block of as many threads, 8 warps).
inline constexpr int64_t kMoeScanTile = 256;
/// Threads of an aux-loss block and the terms each thread adds before the tree.
inline constexpr int64_t kMoeAuxThreads = 256;
inline constexpr int64_t kMoeAuxItemsPerThread = 8;
/// Terms one aux-loss block covers.
inline constexpr int64_t kMoeAuxBlockItems = kMoeAuxThreads * kMoeAuxItemsPerThread;

/// Tiles of the counting passes over `assignments` >= 0.
DHELIX_HOST_DEVICE inline int64_t moe_scan_tiles(int64_t assignments) {
  return (assignments + kMoeScanTile - 1) / kMoeScanTile;
}

/// Blocks of the aux loss's first pass over tokens x experts terms.
DHELIX_HOST_DEVICE inline int64_t moe_aux_blocks(int64_t tokens, int64_t experts) {
  return (tokens * experts + kMoeAuxBlockItems - 1) / kMoeAuxBlockItems;
}

/// Where the router's scratch lives in one workspace: the tile counts, int32 [E][tiles]
/// (expert-major, so pass 2's warp reads one expert's row), then the aux partials, double
/// [blocks], 8-byte aligned.
struct MoeRouteScratch {
  int64_t tiles = 0;
  int64_t aux_blocks = 0;
  int64_t aux_offset_bytes = 0;  ///< of the partials, from the workspace's start
  int64_t bytes = 0;             ///< the workspace the router needs
};

DHELIX_HOST_DEVICE inline MoeRouteScratch moe_route_scratch(int64_t tokens, int64_t top_k,
                                                            int64_t experts) {
  MoeRouteScratch s;
  s.tiles = moe_scan_tiles(tokens * top_k);
  s.aux_blocks = moe_aux_blocks(tokens, experts);
  const int64_t counts_bytes = experts * s.tiles * static_cast<int64_t>(sizeof(int32_t));
  s.aux_offset_bytes = (counts_bytes + 7) / 8 * 8;
  s.bytes = s.aux_offset_bytes + s.aux_blocks * static_cast<int64_t>(sizeof(double));
  return s;
}

/// Assignment `a` is `rank` in its tile among the tile's assignments to expert e, and
/// tile_offset of them came in earlier tiles: its padded row (moe_padded.h).
DHELIX_HOST_DEVICE inline int64_t moe_padded_row_of(int64_t e, int64_t capacity,
                                                    int64_t tile_offset, int64_t rank) {
  return e * capacity + tile_offset + rank;
}

/// Term `item` = t E + e of the aux loss's sum: n_e p_te, exact in double.
DHELIX_HOST_DEVICE inline double moe_aux_term(int64_t item, int64_t experts, const float* probs,
                                              const int64_t* routed) {
  return static_cast<double>(routed[item % experts]) * static_cast<double>(probs[item]);
}

/// Thread `thread`'s partial of aux block `block` over `items` terms: its terms strided by
/// kMoeAuxThreads, ascending.
DHELIX_HOST_DEVICE inline double moe_aux_thread_partial(int64_t block, int64_t thread,
                                                        int64_t items, int64_t experts,
                                                        const float* probs, const int64_t* routed) {
  double sum = 0.0;
  for (int64_t i = 0; i < kMoeAuxItemsPerThread; ++i) {
    const int64_t item = block * kMoeAuxBlockItems + i * kMoeAuxThreads + thread;
    if (item < items) sum += moe_aux_term(item, experts, probs, routed);
  }
  return sum;
}

/// Sums values[count] (count a power of two) by the halving tree of a shared-memory block
/// reduction: values[i] += values[i + half] for half = count / 2, ..., 1. Returns values[0];
/// overwrites the array. The kernel runs each level in parallel (one thread per i), the
/// host in a loop: the same additions.
DHELIX_HOST_DEVICE inline double tree_sum_pow2(double* values, int64_t count) {
  for (int64_t half = count / 2; half > 0; half /= 2) {
    for (int64_t i = 0; i < half; ++i) values[i] += values[i + half];
  }
  return values[0];
}

/// The final pass's thread `thread`: the block partials thread, thread + kMoeAuxThreads, ...
DHELIX_HOST_DEVICE inline double moe_aux_final_partial(int64_t thread, int64_t blocks,
                                                       const double* partials) {
  double sum = 0.0;
  for (int64_t b = thread; b < blocks; b += kMoeAuxThreads) sum += partials[b];
  return sum;
}

/// L_aux from the sum of every term.
DHELIX_HOST_DEVICE inline float moe_aux_loss_of_sum(int64_t tokens, int64_t k, int64_t experts,
                                                    double alpha, double sum) {
  return static_cast<float>(load_balancing_scale(tokens, k, experts, alpha) * sum);
}

}  // namespace dhelix::kernels
