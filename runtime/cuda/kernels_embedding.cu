// The embedding's backward on the GPU (kernels_cuda.h, embedding_backward): the positions
// sorted stably by their token's local row (an LSD radix sort of 8-bit digits, each pass
// the stable counting pass of tile_scan.cuh), then one thread per (run of one token,
// column) adds the run's output-gradient rows into the table row in position order.
// Replaces a link pass in which every position searched all others for its next equal
// token (O(P^2)): the sort is O(P) per digit, ceil(bits(vocab_local + 1) / 8) digits (3 for
// a 128k-entry shard).
//
// Worked example, P = 6, vocab_begin 0, vocab_local 5: tokens [3 1 3 7 1 3] give keys
// (local row + 1, 0 for another shard's token 7) [4 2 4 0 2 4]; sorted stably: keys
// [0 2 2 4 4 4], positions [3 1 4 0 2 5]. Runs start at sorted indices 1 (row 1: positions
// 1, 4) and 3 (row 3: positions 0, 2, 5); key 0 writes nothing. Each run adds its rows in
// ascending position order, the CPU's (kernels::embedding_backward_column): the same fp32
// sums, bit for bit. The host twin is runtime/cpu/embedding_twin.cc.
//
// Failure rules: a workspace smaller than embedding_backward_workspace_bytes is an
// Error(kInternal) naming both sizes; more than INT32_MAX positions a check failure.
// Deterministic: integer counts, a stable sort, fixed run order; no atomics.

#include <cuda_bf16.h>
#include <fmt/format.h>

#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "runtime/cuda/kernels_cuda.h"
#include "runtime/cuda/launch_util.cuh"
#include "runtime/cuda/tile_scan.cuh"
#include "runtime/kernels/embedding.h"

namespace dhelix::cuda {
namespace {

using detail::global_thread;
using detail::grid_threads;

constexpr int kRadixBits = 8;
constexpr int64_t kRadixBuckets = int64_t{1} << kRadixBits;

// Where the sort's buffers live in the workspace: keys and positions twice (ping-pong),
// the tile counts [digit][tile] and the digits' totals.
struct SortScratch {
  int64_t tiles = 0;
  int64_t bytes = 0;
};
SortScratch sort_scratch(int64_t positions) {
  SortScratch s;
  s.tiles = kernels::moe_scan_tiles(positions);
  s.bytes = 4 * positions * static_cast<int64_t>(sizeof(int32_t)) +
            (kRadixBuckets * s.tiles + kRadixBuckets) * static_cast<int64_t>(sizeof(int32_t));
  return s;
}

__global__ void embedding_keys_kernel(int64_t positions, const int64_t* tokens, int64_t vocab_begin,
                                      int64_t vocab_local, uint32_t* keys, int32_t* order) {
  for (int64_t r = global_thread(); r < positions; r += grid_threads()) {
    keys[r] = kernels::embedding_sort_key(tokens[r], vocab_begin, vocab_local);
    order[r] = static_cast<int32_t>(r);
  }
}

// This thread's digit in tile `tile` (-1 past the end).
__device__ inline int tile_digit(int64_t positions, const uint32_t* keys, int shift, int64_t tile) {
  const int64_t i = tile * detail::kScanTile + threadIdx.x;
  return i < positions ? static_cast<int>((keys[i] >> shift) & (kRadixBuckets - 1)) : -1;
}

// A block per tile: tile_counts[digit][tile].
__global__ void radix_counts_kernel(int64_t positions, int shift, const uint32_t* keys,
                                    int32_t* tile_counts) {
  extern __shared__ int warp_counts[];
  const int64_t tiles = kernels::moe_scan_tiles(positions);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    detail::zero_warp_counts(warp_counts, kRadixBuckets);
    detail::warp_rank_and_count(tile_digit(positions, keys, shift, tile), kRadixBuckets,
                                warp_counts);
    __syncthreads();
    detail::store_tile_counts(warp_counts, kRadixBuckets, tiles, tile, tile_counts);
    __syncthreads();
  }
}

// A warp per digit: its row of tile counts to its exclusive scan, its total to totals.
__global__ void radix_scan_kernel(int64_t tiles, int32_t* tile_counts, int32_t* totals) {
  for (int64_t d = detail::global_warp(); d < kRadixBuckets; d += detail::grid_warps()) {
    const int64_t total = detail::warp_exclusive_scan_row(tile_counts + d * tiles, tiles);
    if (detail::lane_id() == 0) totals[d] = static_cast<int32_t>(total);
  }
}

// One warp: the digits' totals to their exclusive scan (each digit's first sorted index).
__global__ void radix_bases_kernel(int32_t* totals) {
  if (detail::global_warp() == 0) detail::warp_exclusive_scan_row(totals, kRadixBuckets);
}

// A block per tile: each item to its digit's base + the digit's count in earlier tiles and
// earlier warps of this tile + its rank in its warp. Stable: earlier items first.
__global__ void radix_scatter_kernel(int64_t positions, int shift, const uint32_t* keys,
                                     const int32_t* order, const int32_t* tile_offsets,
                                     const int32_t* bases, uint32_t* keys_out, int32_t* order_out) {
  extern __shared__ int warp_counts[];
  const int64_t tiles = kernels::moe_scan_tiles(positions);
  const int warp = static_cast<int>(threadIdx.x / kWarpSize);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    detail::zero_warp_counts(warp_counts, kRadixBuckets);
    const int d = tile_digit(positions, keys, shift, tile);
    const int rank = detail::warp_rank_and_count(d, kRadixBuckets, warp_counts);
    __syncthreads();
    detail::scan_warp_counts(warp_counts, kRadixBuckets);
    if (d >= 0) {
      const int64_t i = tile * detail::kScanTile + threadIdx.x;
      const int64_t to = static_cast<int64_t>(bases[d]) + tile_offsets[d * tiles + tile] +
                         warp_counts[warp * kRadixBuckets + d] + rank;
      keys_out[to] = keys[i];
      order_out[to] = order[i];
    }
    __syncthreads();
  }
}

// A thread per (sorted index, column): the first index of each local token's run adds the
// run's rows into its table row (kernels::embedding_run_column_sum).
__global__ void embedding_scatter_kernel(int64_t positions, int64_t dim, const uint32_t* keys,
                                         const int32_t* order, const bf16* dout, float* dtable) {
  for (int64_t item = global_thread(); item < positions * dim; item += grid_threads()) {
    const int64_t i = item / dim;
    const int64_t col = item % dim;
    if (!kernels::embedding_run_starts(i, keys)) continue;
    float* cell = dtable + static_cast<int64_t>(keys[i] - 1) * dim + col;
    *cell = kernels::embedding_run_column_sum(
        i, positions, keys, order, col, *cell,
        [dout, dim](int64_t p, int64_t c) { return __bfloat162float(dout[p * dim + c]); });
  }
}

}  // namespace

int64_t embedding_backward_workspace_bytes(int64_t positions) {
  DHELIX_CHECK(positions >= 0 && positions <= INT32_MAX);
  return sort_scratch(positions).bytes;
}

std::vector<KernelEntry> embedding_kernels() {
#define DHELIX_KERNEL(k) \
  KernelEntry { #k, reinterpret_cast < const void*>(&k) }
  return {DHELIX_KERNEL(embedding_keys_kernel), DHELIX_KERNEL(radix_counts_kernel),
          DHELIX_KERNEL(radix_scan_kernel),     DHELIX_KERNEL(radix_bases_kernel),
          DHELIX_KERNEL(radix_scatter_kernel),  DHELIX_KERNEL(embedding_scatter_kernel)};
#undef DHELIX_KERNEL
}

void embedding_backward(int64_t positions, int64_t dim, const int64_t* tokens, const bf16* dout,
                        int64_t vocab_begin, int64_t vocab_local, float* dtable,
                        const Workspace& workspace, cudaStream_t stream) {
  if (positions == 0 || dim == 0) return;
  const SortScratch scratch = sort_scratch(positions);
  if (workspace.data == nullptr ||
      workspace.bytes < embedding_backward_workspace_bytes(positions)) {
    throw Error(ErrorCode::kInternal,
                fmt::format("embedding_backward: the stream's workspace holds {} bytes, the op "
                            "needs {}",
                            workspace.bytes, scratch.bytes));
  }
  auto* keys = static_cast<uint32_t*>(workspace.data);
  uint32_t* keys_alt = keys + positions;
  auto* order = reinterpret_cast<int32_t*>(keys_alt + positions);
  int32_t* order_alt = order + positions;
  int32_t* tile_counts = order_alt + positions;
  int32_t* totals = tile_counts + kRadixBuckets * scratch.tiles;
  detail::launch(thread_per_item_launch(positions), stream, embedding_keys_kernel, positions,
                 tokens, vocab_begin, vocab_local, keys, order);
  const LaunchConfig tiles = detail::tile_launch(scratch.tiles, kRadixBuckets);
  for (int shift = 0; shift < kernels::embedding_key_bits(vocab_local); shift += kRadixBits) {
    detail::launch(tiles, stream, radix_counts_kernel, positions, shift,
                   static_cast<const uint32_t*>(keys), tile_counts);
    detail::launch(warp_per_row_launch(kRadixBuckets), stream, radix_scan_kernel, scratch.tiles,
                   tile_counts, totals);
    detail::launch(warp_per_row_launch(1), stream, radix_bases_kernel, totals);
    detail::launch(tiles, stream, radix_scatter_kernel, positions, shift,
                   static_cast<const uint32_t*>(keys), static_cast<const int32_t*>(order),
                   static_cast<const int32_t*>(tile_counts), static_cast<const int32_t*>(totals),
                   keys_alt, order_alt);
    std::swap(keys, keys_alt);
    std::swap(order, order_alt);
  }
  detail::launch(thread_per_item_launch(positions * dim), stream, embedding_scatter_kernel,
                 positions, dim, static_cast<const uint32_t*>(keys),
                 static_cast<const int32_t*>(order), dout, dtable);
}

}  // namespace dhelix::cuda
