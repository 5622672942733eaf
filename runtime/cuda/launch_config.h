#pragma once
// Launch shapes of the CUDA kernels (kernels_cuda.h), computed by plain host functions so
// that the CPU tests check them: grid and block sizes for a given tensor shape, the
// dynamic shared memory a kernel needs, and the device limits a shape must respect.
//
//   * row kernels (RMSNorm, cross-entropy statistics): one warp per row, kWarpsPerBlock
//     rows per block; the warp's lanes reduce in the lane-tree order of
//     runtime/kernels/host_device.h;
//   * element kernels (SwiGLU, AdamW, adds, RoPE per head vector, embedding rows, column
//     accumulations): one thread per item, kThreadsPerBlock per block, a grid-stride loop
//     beyond kMaxGridX blocks;
//   * attention (attention_tc.h, tensor cores): one block of 4 warps per (64-query tile,
//     head, sequence) for the forward and dq passes, the K/V tile staged in shared memory
//     as bf16; one block of min(group, 4) warps per (16-key slice, kv head, sequence) for
//     dk/dv, with shared memory for the warps' ordered reduction.
// Example: attention_launch for batch 2, seq 1000, heads 32, head_dim 128 gives grid
// (16, 32, 2), block 128, and 2 x 64 x (128 + 8) x 2 = 34816 bytes of shared memory for
// the K/V tile; attention_dkdv_launch for the same shape with kv_heads 8 gives grid
// (63, 8, 2), block 128 (group 4) and 2 x 16 x 136 x 2 + 4 x 16 x 128 x 4 = 41472 bytes
// (the K/V slice, the warps' partial sums).

#include <cstdint>

#include "runtime/kernels/attention.h"

namespace dhelix::cuda {

inline constexpr int64_t kWarpSize = 32;
inline constexpr int64_t kThreadsPerBlock = 256;
inline constexpr int64_t kWarpsPerBlock = kThreadsPerBlock / kWarpSize;
/// Blocks of an element kernel's grid at most; the kernels loop beyond it.
inline constexpr int64_t kMaxGridX = 65535LL * 16;
/// CUDA's limit on gridDim.y and gridDim.z.
inline constexpr int64_t kMaxGridYZ = 65535;
/// Query rows per forward / dq block, and keys (queries) per staged tile.
inline constexpr int64_t kAttentionTileRows = kernels::kAttentionTileKeys;
/// Rows of one warp's mma (M = 16): the queries of a warp, the keys of a dk/dv block.
inline constexpr int64_t kAttentionSliceRows = 16;
/// Warps of a forward / dq block; the most warps of a dk/dv block.
inline constexpr int64_t kAttentionBlockWarps = 4;
/// Largest head dimension the attention kernels take (the largest kernel instance).
inline constexpr int64_t kMaxHeadDim = 256;
/// Shared memory one block may use on sm_80 and sm_90 with the opt-in attribute, bytes
/// (A100: 163 KiB; H100: 227 KiB; the smaller one).
inline constexpr int64_t kMaxSharedBytes = 163 * 1024;

struct Dim3 {
  int64_t x = 1;
  int64_t y = 1;
  int64_t z = 1;
};

struct LaunchConfig {
  Dim3 grid;
  Dim3 block;
  int64_t shared_bytes = 0;  ///< dynamic shared memory per block
};

/// One warp per row for `rows` >= 0 rows (0 rows: a grid of 0 blocks, launch nothing).
LaunchConfig warp_per_row_launch(int64_t rows);
/// One thread per item for `items` >= 0 items, capped at kMaxGridX blocks.
LaunchConfig thread_per_item_launch(int64_t items);
/// The attention forward (and dq) launch. Throws Error(kUnsupported) naming the limit for
/// a head_dim above kMaxHeadDim, an odd one, or heads or batch above kMaxGridYZ.
LaunchConfig attention_launch(const kernels::AttentionShape& shape);
/// The attention dk/dv launch: 16-key slices, kv heads, sequences; min(group, 4) warps
/// that split the group's query heads. Same limits.
LaunchConfig attention_dkdv_launch(const kernels::AttentionShape& shape);
/// The tensor-core kernels' head dimension in 16-column tiles: head_dim padded to 32, 64,
/// 128 or 256 (2, 4, 8, 16 tiles), one kernel instance each.
int64_t tc_dim_tiles(int64_t head_dim);

/// Row chunks of a two-pass column reduction (kernels_cuda.h, rmsnorm_backward): enough
/// blocks to fill a GPU at any width (hidden 4096: 16 column tiles x 64 chunks = 1024
/// blocks on 132 SMs), and a fixed function of `rows` only, so the same sums every run.
inline constexpr int64_t kMaxColumnChunks = 64;
/// Rows per chunk at least, so that a chunk's loop is not all overhead.
inline constexpr int64_t kMinRowsPerChunk = 16;
/// Chunks for `rows` >= 0 rows: min(kMaxColumnChunks, ceil(rows / kMinRowsPerChunk)), at
/// least 1.
int64_t column_chunks(int64_t rows);
/// Pass 1 of a column reduction: grid (column tiles of kThreadsPerBlock, chunks).
LaunchConfig column_partial_launch(int64_t rows, int64_t dim);

/// ceil(a / b) for a >= 0, b > 0.
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace dhelix::cuda
