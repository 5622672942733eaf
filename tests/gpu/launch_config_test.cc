#include "runtime/cuda/launch_config.h"

#include <gtest/gtest.h>

#include "lib/error.h"

namespace dhelix::cuda {
namespace {

TEST(LaunchConfig, WarpPerRowPacksEightRowsPerBlock) {
  const LaunchConfig config = warp_per_row_launch(1000);
  EXPECT_EQ(config.block.x, 256);
  EXPECT_EQ(config.grid.x, 125);
  EXPECT_EQ(warp_per_row_launch(1001).grid.x, 126);
  EXPECT_EQ(warp_per_row_launch(0).grid.x, 0);
  EXPECT_EQ(config.shared_bytes, 0);
}

TEST(LaunchConfig, ThreadPerItemCapsTheGrid) {
  EXPECT_EQ(thread_per_item_launch(256).grid.x, 1);
  EXPECT_EQ(thread_per_item_launch(257).grid.x, 2);
  // 2^40 items would need 2^32 blocks: capped, the kernels' grid-stride loops cover the rest.
  EXPECT_EQ(thread_per_item_launch(int64_t{1} << 40).grid.x, 65535LL * 16);
}

// The example of the header comment.
TEST(LaunchConfig, AttentionGridIsQueryTilesHeadsSequences) {
  const LaunchConfig config =
      attention_launch({.batch = 2, .seq = 1000, .heads = 32, .kv_heads = 8, .head_dim = 128});
  EXPECT_EQ(config.grid.x, 16);
  EXPECT_EQ(config.grid.y, 32);
  EXPECT_EQ(config.grid.z, 2);
  EXPECT_EQ(config.block.x, 128);  // 4 warps of 16 query rows
  // K and V tiles: 64 keys x (128 + 8) bf16 each.
  EXPECT_EQ(config.shared_bytes, 34816);
}

TEST(LaunchConfig, AttentionDkDvGridIsKeySlicesKvHeadsSequences) {
  const LaunchConfig config =
      attention_dkdv_launch({.batch = 3, .seq = 64, .heads = 32, .kv_heads = 8, .head_dim = 64});
  EXPECT_EQ(config.grid.x, 4);  // 16 keys per block
  EXPECT_EQ(config.grid.y, 8);
  EXPECT_EQ(config.grid.z, 3);
  EXPECT_EQ(config.block.x, 128);  // group 4: one query head per warp
  // K and V slices (2 x 16 x (64 + 8) bf16) and 4 warps' partial sums (4 x 16 x 64 floats).
  EXPECT_EQ(config.shared_bytes, 2 * 16 * 72 * 2 + 4 * 16 * 64 * 4);
  // The header comment's example.
  const LaunchConfig example =
      attention_dkdv_launch({.batch = 2, .seq = 1000, .heads = 32, .kv_heads = 8, .head_dim = 128});
  EXPECT_EQ(example.grid.x, 63);
  EXPECT_EQ(example.shared_bytes, 41472);
  // A group of 8 runs on 4 warps, two heads each; a group of 1 on one warp.
  EXPECT_EQ(attention_dkdv_launch({.batch = 1, .seq = 8, .heads = 8, .kv_heads = 1, .head_dim = 64})
                .block.x,
            128);
  EXPECT_EQ(attention_dkdv_launch({.batch = 1, .seq = 8, .heads = 8, .kv_heads = 8, .head_dim = 64})
                .block.x,
            32);
  // The largest head dimension still fits the smaller (A100) shared-memory limit.
  for (const LaunchConfig& largest :
       {attention_launch(
            {.batch = 1, .seq = 1, .heads = 8, .kv_heads = 1, .head_dim = kMaxHeadDim}),
        attention_dkdv_launch(
            {.batch = 1, .seq = 1, .heads = 8, .kv_heads = 1, .head_dim = kMaxHeadDim})}) {
    EXPECT_LE(largest.shared_bytes, kMaxSharedBytes);
  }
}

// Head dimensions padded to the kernel instances: 32, 64, 128, 256.
TEST(LaunchConfig, TensorCoreKernelsPadTheHeadDimension) {
  EXPECT_EQ(tc_dim_tiles(2), 2);
  EXPECT_EQ(tc_dim_tiles(32), 2);
  EXPECT_EQ(tc_dim_tiles(34), 4);
  EXPECT_EQ(tc_dim_tiles(64), 4);
  EXPECT_EQ(tc_dim_tiles(80), 8);
  EXPECT_EQ(tc_dim_tiles(128), 8);
  EXPECT_EQ(tc_dim_tiles(130), 16);
  EXPECT_EQ(tc_dim_tiles(256), 16);
}

TEST(LaunchConfig, AttentionRefusesShapesOutsideTheKernelsLimits) {
  try {
    attention_launch({.batch = 1, .seq = 8, .heads = 2, .kv_heads = 1, .head_dim = 320});
    FAIL() << "head_dim 320 accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kUnsupported);
    EXPECT_STREQ(error.what(), "CUDA attention: head_dim 320 is not an even number in [2, 256]");
  }
  EXPECT_THROW(attention_launch({.batch = 1, .seq = 8, .heads = 2, .kv_heads = 1, .head_dim = 63}),
               Error);
  try {
    attention_dkdv_launch({.batch = 70000, .seq = 8, .heads = 2, .kv_heads = 1, .head_dim = 64});
    FAIL() << "70000 sequences accepted";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(),
                 "CUDA attention: 2 heads x 70000 sequences exceeds the grid limit 65535");
  }
}

TEST(LaunchConfig, ColumnReductionsFillTheGpuWithAFixedChunking) {
  // Hidden 4096 over 8192 rows: 16 column tiles x 64 chunks of 128 rows = 1024 blocks.
  const LaunchConfig config = column_partial_launch(8192, 4096);
  EXPECT_EQ(config.grid.x, 16);
  EXPECT_EQ(config.grid.y, 64);
  EXPECT_EQ(config.block.x, kThreadsPerBlock);
  // Few rows: chunks of at least 16 rows; never 0 chunks.
  EXPECT_EQ(column_chunks(40), 3);
  EXPECT_EQ(column_chunks(1), 1);
  EXPECT_EQ(column_chunks(0), 1);
  // The chunking is a function of the row count only: the same sums every run.
  EXPECT_EQ(column_chunks(1 << 20), kMaxColumnChunks);
}

}  // namespace
}  // namespace dhelix::cuda
