#include "profiler/compute_cost.h"

#include <gtest/gtest.h>

#include "tests/profiler/llama70b_ops.h"

namespace dhelix {
namespace {

using test::a100_like_gpu;

TEST(ComputeCost, TilesAndWaves) {
  EXPECT_EQ(gemm_tiles(1024, 1024), 64);  // 8 x 8
  EXPECT_EQ(gemm_tiles(1000, 129), 16);   // ceil(1000/128) = 8, ceil(129/128) = 2
  EXPECT_EQ(gemm_waves(108, 108), 1);
  EXPECT_EQ(gemm_waves(109, 108), 2);
  EXPECT_EQ(gemm_waves(108, 107), 2);
  EXPECT_DOUBLE_EQ(gemm_size_factor(1024, 4096, 8192), 1024.0 / 1120.0);
  // n = 64 is padded to one tile of 128 columns, which the tile count already charges.
  EXPECT_DOUBLE_EQ(gemm_size_factor(8192, 64, 8192), 128.0 / 224.0);
  EXPECT_DOUBLE_EQ(gemm_size_factor(1, 768, 4096), 128.0 / 224.0);
  EXPECT_DOUBLE_EQ(gemm_size_factor(8192, 8192, 64), 64.0 / 160.0);  // a short k loop
}

// Sequence 1 (m = 1 token): the GEMM computes one padded tile row, exactly what m = 128 does,
// so it takes the m = 128 time. Hand computed, A100-like GPU, n = 768, k = 4096 (Llama-8B's
// QKV at TP 8): 6 tiles, 1 wave; per-SM rate 312e6 * 0.84 * (128/224) / 108 = 1.386667e6
// FLOP/us; one tile 2*128*128*4096 = 134,217,728 FLOP -> 96.7916 us; + 3 us = 99.7916 us. The
// size factor once took d = m = 1 (1/97) on top of the padding: 5368 us, 54 times more.
TEST(ComputeCost, OneTokenGemmCostsOneTileRow) {
  const double one = compute_time_us(a100_like_gpu(), test::gemm_op("g", 1, 768, 4096));
  EXPECT_NEAR(one, 99.7916, 1e-3);
  EXPECT_DOUBLE_EQ(one, compute_time_us(a100_like_gpu(), test::gemm_op("g", 128, 768, 4096)));
  // Non-decreasing in m up to a tile, and in n likewise.
  double previous = 0;
  for (int64_t m = 1; m <= 128; ++m) {
    const double t = compute_time_us(a100_like_gpu(), test::gemm_op("g", m, 768, 4096));
    EXPECT_GE(t, previous) << "m = " << m;
    previous = t;
  }
  previous = 0;
  for (int64_t n = 1; n <= 128; ++n) {
    const double t = compute_time_us(a100_like_gpu(), test::gemm_op("g", 4096, n, 4096));
    EXPECT_GE(t, previous) << "n = " << n;
    previous = t;
  }
}

TEST(ComputeCost, Gemm1024CubedReaches38PercentOfPeakOnA100) {
  // 64 tiles -> 1 wave on 108 SMs. Per-SM rate = 312e6 FLOP/us * 0.84 * (1024/1120) / 108
  // = 2.218667e6 FLOP/us; one tile = 2*128*128*1024 = 33,554,432 FLOP -> 15.1237 us;
  // + 3 us launch = 18.1237 us. 2*1024^3 / (18.1237 us * 312e6 FLOP/us) = 37.98 % of peak.
  const Op op = test::gemm_op("g", 1024, 1024, 1024);
  const double time_us = compute_time_us(a100_like_gpu(), op);
  EXPECT_NEAR(time_us, 18.1237, 1e-3);
  EXPECT_NEAR(op.flops / (time_us * 312e6), 0.3798, 1e-3);
}

TEST(ComputeCost, Gemm8192CubedReachesTheLargeShapeEfficiency) {
  // 4096 tiles -> 38 waves. Per-SM rate = 312e6 * 0.84 * (8192/8288) / 108 = 2.398644e6;
  // one tile = 268,435,456 FLOP -> 111.9153 us per wave; 38 waves = 4252.78 us; + 3 us.
  // Fraction of peak = 2*8192^3 / (4255.78 * 312e6) = 82.8 % (82-86 % measured).
  const Op op = test::gemm_op("g", 8192, 8192, 8192);
  const double time_us = compute_time_us(a100_like_gpu(), op);
  EXPECT_NEAR(time_us, 4255.782, 1e-2);
  EXPECT_NEAR(op.flops / (time_us * 312e6), 0.8281, 1e-3);
}

TEST(ComputeCost, LosingOneSmCostsAGemmOfExactlySmCountTilesASecondWave) {
  // 1536 x 1152 = 12 x 9 = 108 tiles, k = 4096: size factor 1152/1248; per-SM rate
  // 312e6*0.84*(1152/1248)/108 = 2.24e6 FLOP/us; tile 2*128*128*4096 = 134,217,728 FLOP
  // -> 59.9186 us per wave. 108 SMs: 3 + 59.9186 = 62.9186; 107 SMs: 3 + 2*59.9186.
  const KernelCost cost =
      compute_kernel_cost(a100_like_gpu(), test::gemm_op("g", 1536, 1152, 4096));
  EXPECT_EQ(cost.tiles, 108);
  EXPECT_NEAR(kernel_time_us(a100_like_gpu(), cost), 62.9186, 1e-3);
  EXPECT_NEAR(kernel_time_us(a100_like_gpu(), cost, {.sms = 107}), 122.8373, 1e-3);
}

TEST(ComputeCost, GroupedGemmSharesOneLaunchAndCountsWavesOverAllGroups) {
  // 4 groups of 512 x 1024 x 4096: 4 * 4 * 8 = 128 tiles -> 2 waves on 108 SMs; size factor
  // 512/608; per-SM rate 312e6*0.84*(512/608)/108 = 2.043509e6; tile 134,217,728 FLOP
  // -> 65.6800 us per wave; 2 waves + 3 us = 134.3601 us.
  Op op = test::gemm_op("g", 512, 1024, 4096);
  op.kind = OpKind::kGroupedGemm;
  op.shape.batch = 4;
  EXPECT_NEAR(compute_time_us(a100_like_gpu(), op), 134.3601, 1e-3);
}

TEST(ComputeCost, AttentionUsesFlashAttentionWorkCounts) {
  // Forward work 4 * 1 * 8 * 4096 * 4096 * 128 / 2 (causal) = 34,359,738,368 FLOP at
  // 312e6 * 0.57 FLOP/us = 193.2059 us, + 3 = 196.2059 us. Backward: 2.5x the work:
  // 483.0148 + 3 = 486.0148 us.
  EXPECT_NEAR(compute_time_us(a100_like_gpu(), test::flash_attention(Pass::kForward)), 196.2059,
              1e-3);
  EXPECT_NEAR(compute_time_us(a100_like_gpu(), test::flash_attention(Pass::kBackward)), 486.0148,
              1e-3);
  Op full = test::flash_attention(Pass::kForward);
  full.shape.causal = false;  // twice the work of the causal case
  EXPECT_NEAR(compute_time_us(a100_like_gpu(), full), 3 + 2 * 193.2059, 1e-3);
}

TEST(ComputeCost, MemoryBoundOpsPayBytesOverUsableBandwidth) {
  // 134,217,728 bytes / (2039e3 * 0.85 bytes/us = 1,733,150) = 77.4415 us, + 3 us.
  const KernelCost cost = compute_kernel_cost(a100_like_gpu(), test::norm_op());
  EXPECT_TRUE(is_memory_bound(cost));
  EXPECT_NEAR(kernel_time_us(a100_like_gpu(), cost), 80.4415, 1e-3);
  // Half the memory bandwidth doubles the memory part; fewer SMs change nothing.
  EXPECT_NEAR(kernel_time_us(a100_like_gpu(), cost, {.memory_fraction = 0.5}), 3 + 2 * 77.4415,
              1e-3);
  EXPECT_NEAR(kernel_time_us(a100_like_gpu(), cost, {.sms = 54}), 80.4415, 1e-3);
}

TEST(ComputeCost, GemmBytesAreCountedInDoubleWithoutOverflow) {
  // m = k = 2^32, n = 1: m·k = 2^64 overflows int64. Bytes = 2 · (2^64 + 2^32 + 2^32) over
  // 1,733,150 bytes/us.
  const double two_32 = 4294967296.0;
  const KernelCost cost =
      gemm_kernel_cost(a100_like_gpu(), int64_t{1} << 32, 1, int64_t{1} << 32, 1, 2);
  EXPECT_DOUBLE_EQ(cost.memory_us, 2 * (two_32 * two_32 + 2 * two_32) / (2039e3 * 0.85));
}

TEST(ComputeCost, SmallKGemmIsLimitedByMemory) {
  // 8192 x 8192 x 16: compute = 64 x 64 = 4096 tiles -> 38 waves of 2*128*128*16 FLOP at
  // 312e6*0.84*(16/112)/108 per SM = 0.3466667e6 -> 1.5124 us/wave -> 57.4700 us; memory =
  // 2*(8192*16*2 + 8192*8192) bytes = 134,742,016 / 1,733,150 = 77.7440 us, which wins.
  const KernelCost cost = compute_kernel_cost(a100_like_gpu(), test::gemm_op("g", 8192, 8192, 16));
  EXPECT_TRUE(is_memory_bound(cost));
  EXPECT_NEAR(kernel_time_us(a100_like_gpu(), cost), 3 + 77.7440, 1e-3);
}

TEST(ComputeCost, GemmWithoutShapeFallsBackToFlopsAtLargeShapeEfficiency) {
  // 1e9 FLOP / (312e6 * 0.84) = 3.8156 us + 3.
  Op op;
  op.id = "router";
  op.kind = OpKind::kRouter;
  op.flops = 1e9;
  EXPECT_NEAR(compute_time_us(a100_like_gpu(), op), 6.8156, 1e-3);
}

}  // namespace
}  // namespace dhelix
