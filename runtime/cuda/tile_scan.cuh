#pragma once
// A stable counting pass over tiles of items, the device half of
// runtime/kernels/moe_route_scan.h's decomposition (a histogram per tile, an exclusive scan
// per bucket over the tiles, each item's rank among its tile's earlier items of its
// bucket). The MoE router (kernels_moe_route.cu: buckets = experts) and the embedding's
// radix sort (kernels_embedding.cu: buckets = 8-bit digits) share it. Device code only.
//
// A tile is one block of kScanTile threads (kTileWarps warps), one item per thread; a
// warp finds its lanes of equal bucket with one __match_any_sync, so a tile costs a few
// instructions per item whatever the number of buckets. warp_counts is the block's
// shared array [kTileWarps][buckets].

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda/launch_util.cuh"
#include "runtime/kernels/moe_route_scan.h"

namespace dhelix::cuda::detail {

inline constexpr unsigned kFullMask = 0xffffffffu;
inline constexpr int64_t kScanTile = kernels::kMoeScanTile;
inline constexpr int kTileWarps = static_cast<int>(kScanTile / kWarpSize);
static_assert(kScanTile % kWarpSize == 0, "a tile is whole warps");

__device__ inline int lane_id() { return static_cast<int>(threadIdx.x % kWarpSize); }
__device__ inline int64_t global_warp() { return global_thread() / kWarpSize; }
__device__ inline int64_t grid_warps() { return grid_threads() / kWarpSize; }

/// Shared bytes of a tile kernel's warp_counts for `buckets`.
inline int64_t tile_shared_bytes(int64_t buckets) {
  return kTileWarps * buckets * static_cast<int64_t>(sizeof(int));
}

/// A block per tile, warp_counts in dynamic shared memory, at most kMaxGridX blocks (the
/// kernels loop beyond).
inline LaunchConfig tile_launch(int64_t tiles, int64_t buckets) {
  LaunchConfig config;
  config.grid.x = tiles < kMaxGridX ? tiles : kMaxGridX;
  config.block.x = kScanTile;
  config.shared_bytes = tile_shared_bytes(buckets);
  return config;
}

/// Zeroes warp_counts and waits for the block.
__device__ inline void zero_warp_counts(int* warp_counts, int64_t buckets) {
  for (int64_t i = threadIdx.x; i < kTileWarps * buckets; i += blockDim.x) warp_counts[i] = 0;
  __syncthreads();
}

/// This thread's item, of `bucket` (-1: not counted), among its warp: its rank among the
/// warp's earlier lanes of that bucket; the warp's first such lane stores the warp's count
/// in warp_counts[warp][bucket]. Every lane of the warp calls it.
__device__ inline int warp_rank_and_count(int bucket, int64_t buckets, int* warp_counts) {
  const unsigned peers = __match_any_sync(kFullMask, bucket);
  const unsigned earlier = (1u << lane_id()) - 1u;
  const int warp = static_cast<int>(threadIdx.x / kWarpSize);
  if (bucket >= 0 && (peers & earlier) == 0) warp_counts[warp * buckets + bucket] = __popc(peers);
  return __popc(peers & earlier);
}

/// After warp_rank_and_count and a __syncthreads: out[bucket * tiles + tile] = the tile's
/// count of each bucket.
__device__ inline void store_tile_counts(const int* warp_counts, int64_t buckets, int64_t tiles,
                                         int64_t tile, int32_t* out) {
  for (int64_t b = threadIdx.x; b < buckets; b += blockDim.x) {
    int sum = 0;
    for (int w = 0; w < kTileWarps; ++w) sum += warp_counts[w * buckets + b];
    out[b * tiles + tile] = sum;
  }
}

/// After warp_rank_and_count and a __syncthreads: warp_counts[w][b] becomes the count of
/// bucket b in the tile's warps before w (an exclusive scan over the warps, in place);
/// ends with a __syncthreads.
__device__ inline void scan_warp_counts(int* warp_counts, int64_t buckets) {
  for (int64_t b = threadIdx.x; b < buckets; b += blockDim.x) {
    int running = 0;
    for (int w = 0; w < kTileWarps; ++w) {
      const int here = warp_counts[w * buckets + b];
      warp_counts[w * buckets + b] = running;
      running += here;
    }
  }
  __syncthreads();
}

/// One warp: the row counts[tiles] becomes its exclusive scan, 32 tiles a step (an
/// inclusive shuffle-up scan per step); returns the row's total on every lane.
__device__ inline int64_t warp_exclusive_scan_row(int32_t* counts, int64_t tiles) {
  const int lane = lane_id();
  int64_t running = 0;
  for (int64_t base = 0; base < tiles; base += kWarpSize) {
    const int64_t tile = base + lane;
    const int here = tile < tiles ? counts[tile] : 0;
    int inclusive = here;
    for (int offset = 1; offset < kWarpSize; offset *= 2) {
      const int up = __shfl_up_sync(kFullMask, inclusive, offset);
      if (lane >= offset) inclusive += up;
    }
    if (tile < tiles) counts[tile] = static_cast<int32_t>(running + inclusive - here);
    running += __shfl_sync(kFullMask, inclusive, kWarpSize - 1);
  }
  return running;
}

}  // namespace dhelix::cuda::detail
