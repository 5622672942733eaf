#include "runtime/cuda/launch_config.h"

#include <fmt/format.h>

#include <algorithm>

#include "lib/error.h"

namespace dhelix::cuda {
namespace {

void check_attention_shape(const kernels::AttentionShape& shape) {
  DHELIX_CHECK(shape.batch >= 0 && shape.seq >= 0 && shape.heads >= 1 && shape.kv_heads >= 1);
  if (shape.head_dim < 2 || shape.head_dim > kMaxHeadDim || shape.head_dim % 2 != 0) {
    throw Error(ErrorCode::kUnsupported,
                fmt::format("CUDA attention: head_dim {} is not an even number in [2, {}]",
                            shape.head_dim, kMaxHeadDim));
  }
  if (shape.heads > kMaxGridYZ || shape.batch > kMaxGridYZ) {
    throw Error(ErrorCode::kUnsupported,
                fmt::format("CUDA attention: {} heads x {} sequences exceeds the grid limit {}",
                            shape.heads, shape.batch, kMaxGridYZ));
  }
}

}  // namespace

LaunchConfig warp_per_row_launch(int64_t rows) {
  DHELIX_CHECK(rows >= 0);
  LaunchConfig config;
  config.block.x = kThreadsPerBlock;
  config.grid.x = std::min(ceil_div(rows, kWarpsPerBlock), kMaxGridX);
  return config;
}

LaunchConfig thread_per_item_launch(int64_t items) {
  DHELIX_CHECK(items >= 0);
  LaunchConfig config;
  config.block.x = kThreadsPerBlock;
  config.grid.x = std::min(ceil_div(items, kThreadsPerBlock), kMaxGridX);
  return config;
}

int64_t tc_dim_tiles(int64_t head_dim) {
  for (int64_t tiles : {2, 4, 8}) {
    if (head_dim <= 16 * tiles) return tiles;
  }
  return 16;
}

LaunchConfig attention_launch(const kernels::AttentionShape& shape) {
  check_attention_shape(shape);
  LaunchConfig config;
  config.grid = {ceil_div(shape.seq, kAttentionTileRows), shape.heads, shape.batch};
  config.block.x = kAttentionBlockWarps * kWarpSize;
  // The K and V tiles, bf16, rows padded by 8 elements against shared-memory bank conflicts.
  config.shared_bytes = 2 * kAttentionTileRows * (16 * tc_dim_tiles(shape.head_dim) + 8) * 2;
  return config;
}

LaunchConfig attention_dkdv_launch(const kernels::AttentionShape& shape) {
  check_attention_shape(shape);
  LaunchConfig config;
  config.grid = {ceil_div(shape.seq, kAttentionSliceRows), shape.kv_heads, shape.batch};
  const int64_t warps = std::min(shape.heads / shape.kv_heads, kAttentionBlockWarps);
  config.block.x = warps * kWarpSize;
  // The block's keys and values (bf16, rows padded by 8), then each warp's partial dk (then
  // dv), fp32, for the ordered reduction.
  const int64_t dims = 16 * tc_dim_tiles(shape.head_dim);
  config.shared_bytes =
      2 * kAttentionSliceRows * (dims + 8) * 2 + warps * kAttentionSliceRows * dims * 4;
  return config;
}

int64_t column_chunks(int64_t rows) {
  DHELIX_CHECK(rows >= 0);
  return std::clamp<int64_t>(ceil_div(rows, kMinRowsPerChunk), 1, kMaxColumnChunks);
}

LaunchConfig column_partial_launch(int64_t rows, int64_t dim) {
  DHELIX_CHECK(dim >= 0);
  LaunchConfig config;
  config.block.x = kThreadsPerBlock;
  config.grid.x = ceil_div(dim, kThreadsPerBlock);
  config.grid.y = column_chunks(rows);
  return config;
}

}  // namespace dhelix::cuda
