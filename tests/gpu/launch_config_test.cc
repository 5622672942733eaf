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
  EXPECT_EQ(config.block.x, 64);
  EXPECT_EQ(config.shared_bytes, 65536);
}

TEST(LaunchConfig, AttentionDkDvGridIsKeyTilesKvHeadsSequences) {
  const LaunchConfig config =
      attention_dkdv_launch({.batch = 3, .seq = 64, .heads = 32, .kv_heads = 8, .head_dim = 64});
  EXPECT_EQ(config.grid.x, 1);
  EXPECT_EQ(config.grid.y, 8);
  EXPECT_EQ(config.grid.z, 3);
  // q and dout tiles (2 x 64 x 64 floats) and 64 lse + 64 delta.
  EXPECT_EQ(config.shared_bytes, (2 * 64 * 64 + 128) * 4);
  // The largest head dimension still fits the smaller (A100) shared-memory limit.
  EXPECT_LE(attention_dkdv_launch(
                {.batch = 1, .seq = 1, .heads = 1, .kv_heads = 1, .head_dim = kMaxHeadDim})
                .shared_bytes,
            kMaxSharedBytes);
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
