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
//   * attention: one block per (query tile, head, sequence) for the forward and dq passes,
//     one per (key tile, kv head, sequence) for dk/dv; one thread per query (key) row; the
//     partner tile staged in shared memory as fp32.
// Example: attention_launch for batch 2, seq 1000, heads 32, head_dim 128 gives grid
// (16, 32, 2), block 64, and 2 x 64 x 128 x 4 = 65536 bytes of shared memory for the K/V
// tile (past the 48 KiB default: the launcher raises the kernel's limit).

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
/// Query (key) rows per attention block, and keys (queries) per staged tile.
inline constexpr int64_t kAttentionTileRows = kernels::kAttentionTileKeys;
/// Largest head dimension the attention kernels take (per-thread fp32 arrays).
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
/// The attention dk/dv launch: tiles over keys, kv heads, sequences; stages a query tile,
/// its output-gradient tile and their lse and delta. Same limits.
LaunchConfig attention_dkdv_launch(const kernels::AttentionShape& shape);

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
