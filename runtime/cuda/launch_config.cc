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

LaunchConfig attention_launch(const kernels::AttentionShape& shape) {
  check_attention_shape(shape);
  LaunchConfig config;
  config.grid = {ceil_div(shape.seq, kAttentionTileRows), shape.heads, shape.batch};
  config.block.x = kAttentionTileRows;
  // The K and V tiles, fp32.
  config.shared_bytes = 2 * kAttentionTileRows * shape.head_dim * 4;
  return config;
}

LaunchConfig attention_dkdv_launch(const kernels::AttentionShape& shape) {
  check_attention_shape(shape);
  LaunchConfig config;
  config.grid = {ceil_div(shape.seq, kAttentionTileRows), shape.kv_heads, shape.batch};
  config.block.x = kAttentionTileRows;
  // The q and dout tiles, fp32, then lse and delta of the tile's queries.
  config.shared_bytes = (2 * kAttentionTileRows * shape.head_dim + 2 * kAttentionTileRows) * 4;
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
