#include "profiler/interference.h"

#include <cstdio>

#include <gtest/gtest.h>

#include "lib/cluster_reader.h"
#include "tests/profiler/llama70b_ops.h"

namespace dhelix {
namespace {

using test::a100_like_cluster;

TEST(Interference, PiecewiseFinishTimes) {
  // a = 10 us, b = 20 us, both at half speed: a ends at 20, b has done 10 and needs 10 more.
  CoRun run = co_run_from_rates(10, 20, {0.5, 0.5});
  EXPECT_DOUBLE_EQ(run.finish_a_us, 20);
  EXPECT_DOUBLE_EQ(run.finish_b_us, 30);
  EXPECT_DOUBLE_EQ(run.makespan_us, 30);
  EXPECT_DOUBLE_EQ(run.oef, 0);  // (10 + 20 - 30) / 10
  // a at full speed, b at half: a ends at 10, b has done 5, ends at 25; OEF (30-25)/10.
  run = co_run_from_rates(10, 20, {1.0, 0.5});
  EXPECT_DOUBLE_EQ(run.finish_a_us, 10);
  EXPECT_DOUBLE_EQ(run.finish_b_us, 25);
  EXPECT_DOUBLE_EQ(run.oef, 0.5);
  // b ends first: a = 30 at 0.5, b = 5 at 0.25 -> b at 20, a has done 10, ends at 40.
  run = co_run_from_rates(30, 5, {0.5, 0.25});
  EXPECT_DOUBLE_EQ(run.finish_b_us, 20);
  EXPECT_DOUBLE_EQ(run.finish_a_us, 40);
  EXPECT_DOUBLE_EQ(run.oef, -1);  // (30 + 5 - 40) / 5
}

TEST(Interference, GemmOfExactlySmCountTilesPaysASecondWaveNextToNccl) {
  // 108-tile GEMM (solo 62.9186 us) loses 16 SMs to NCCL: 2 waves = 122.8373 us, rate
  // 0.512219. Memory: GEMM pulls 14.747/59.919 = 0.246 of the bandwidth, the all-gather
  // 2.5 * 232,000 / 1,733,150 = 0.335: no contention, the all-gather keeps rate 1 and hides
  // the GEMM entirely (OEF 1).
  const ClusterSpec cluster = a100_like_cluster();
  const CoRun run = co_run(cluster, test::gemm_op("g", 1536, 1152, 4096), test::local_all_gather());
  EXPECT_NEAR(run.rates.rate_a, 62.9186 / 122.8373, 1e-5);
  EXPECT_DOUBLE_EQ(run.rates.rate_b, 1.0);
  EXPECT_NEAR(run.finish_a_us, 122.8373, 1e-3);
  EXPECT_NEAR(run.finish_b_us, 316.1046, 1e-3);
  EXPECT_NEAR(run.oef, 1.0, 1e-9);
}

TEST(Interference, MemoryBoundOpAndCollectiveShareMemoryBandwidth) {
  // Norm demand 1, all-gather 2.5 * 232,000 / 1,733,150 = 0.334651: together 1.334651 > 1.
  // The all-gather, held to its link's pace, asks for less than half and gets all of it
  // (rate 1); the norm gets the rest, 0.665349: its memory part 77.4415 us becomes
  // 77.4415 / 0.665349 = 116.3923, so it takes 3 + 116.3923 = 119.3923 us, rate
  // 80.4415 / 119.3923 = 0.673758. The all-gather ends at its solo 316.1046 and hides the
  // norm entirely: OEF = (80.4415 + 316.1046 - 316.1046) / 80.4415 = 1.
  const CoRun run = co_run(a100_like_cluster(), test::norm_op(), test::local_all_gather());
  EXPECT_NEAR(run.rates.rate_a, 0.673758, 1e-6);
  EXPECT_DOUBLE_EQ(run.rates.rate_b, 1.0);
  EXPECT_NEAR(run.finish_a_us, 119.3923, 1e-3);
  EXPECT_NEAR(run.finish_b_us, 316.1046, 1e-3);
  EXPECT_NEAR(run.oef, 1.0, 1e-9);
  // Order does not matter.
  const CoRun swapped = co_run(a100_like_cluster(), test::local_all_gather(), test::norm_op());
  EXPECT_DOUBLE_EQ(swapped.finish_a_us, run.finish_b_us);
  EXPECT_DOUBLE_EQ(swapped.finish_b_us, run.finish_a_us);
}

TEST(Interference, MemoryBandwidthIsSharedMaxMin) {
  // Fit: both served.
  MemoryShares s = collective_memory_shares(0.3, 0.2);
  EXPECT_DOUBLE_EQ(s.compute, 0.3);
  EXPECT_DOUBLE_EQ(s.collective, 0.2);
  // A saturating kernel beside a collective that wants 0.3: 0.7 and 0.3.
  s = collective_memory_shares(1.0, 0.3);
  EXPECT_DOUBLE_EQ(s.compute, 0.7);
  EXPECT_DOUBLE_EQ(s.collective, 0.3);
  // The other way round: the kernel's 0.4 is below half, the collective gets 0.6 of its 0.9.
  s = collective_memory_shares(0.4, 0.9);
  EXPECT_DOUBLE_EQ(s.compute, 0.4);
  EXPECT_DOUBLE_EQ(s.collective, 0.6);
  // Both above half: half each.
  s = collective_memory_shares(0.8, 0.9);
  EXPECT_DOUBLE_EQ(s.compute, 0.5);
  EXPECT_DOUBLE_EQ(s.collective, 0.5);
  // 0.6 + 0.45: the collective's 0.45 in full, the kernel 0.55.
  s = collective_memory_shares(0.6, 0.45);
  EXPECT_DOUBLE_EQ(s.compute, 0.55);
  EXPECT_DOUBLE_EQ(s.collective, 0.45);
}

TEST(Interference, TwoLargeGemmsTimeSlice) {
  // 4096 tiles each: 54 SMs each -> 76 waves instead of 38: 3 + 76 * 111.91532 = 8508.5646 us,
  // times 1.05 contention = 8933.9928: rate = 4255.7823 / 8933.9928 = 0.476358; both end
  // together at T / rate, so OEF = 2 - 1 / 0.476358 = -0.099260.
  const Op gemm = test::gemm_op("g", 8192, 8192, 8192);
  const CoRun run = co_run(a100_like_cluster(), gemm, gemm);
  EXPECT_NEAR(run.rates.rate_a, 0.476358, 1e-6);
  EXPECT_NEAR(run.oef, -0.099260, 1e-6);
}

TEST(Interference, OnOneSmTwoKernelsTakeTurns) {
  // One SM cannot be split (and NCCL cannot have one: the cluster reader wants
  // nccl_sms < sm_count): both GEMMs keep it at half speed, times the 1.05 contention. Memory
  // demand is tiny on one SM, so nothing else slows them.
  ClusterSpec cluster = a100_like_cluster();
  cluster.gpu.sm_count = 1;
  const Op gemm = test::gemm_op("g", 8192, 8192, 8192);
  const CoRunRates rates = co_run_rates(cluster, gemm, gemm);
  EXPECT_NEAR(rates.rate_a, 1 / 2.1, 1e-12);
  EXPECT_NEAR(rates.rate_b, 1 / 2.1, 1e-12);
}

TEST(Interference, SmallKernelsThatFitSideBySideDoNotSlowEachOther) {
  // 64 + 16 tiles fit in 108 SMs; memory demands are small.
  const CoRun run = co_run(a100_like_cluster(), test::gemm_op("a", 1024, 1024, 1024),
                           test::gemm_op("b", 512, 512, 2048));
  EXPECT_DOUBLE_EQ(run.rates.rate_a, 1.0);
  EXPECT_DOUBLE_EQ(run.rates.rate_b, 1.0);
  EXPECT_DOUBLE_EQ(run.oef, 1.0);
}

TEST(Interference, CollectivesOnOneLinkShareItAndOnTwoLinksOverlap) {
  const ClusterSpec cluster = a100_like_cluster();
  const CoRun same = co_run(cluster, test::local_all_gather(), test::local_all_gather());
  EXPECT_DOUBLE_EQ(same.rates.rate_a, 0.5);
  EXPECT_NEAR(same.makespan_us, 2 * 316.1046, 1e-3);
  EXPECT_NEAR(same.oef, 0, 1e-12);
  // NVLink and the NICs: memory demands 0.335 + 2.5 * 12,000 / 1,733,150 = 0.352 < 1.
  const CoRun both = co_run(cluster, test::local_all_gather(), test::cross_all_to_all());
  EXPECT_DOUBLE_EQ(both.rates.rate_a, 1.0);
  EXPECT_DOUBLE_EQ(both.oef, 1.0);
}

TEST(Interference, OnPcieNodesNicTrafficAlsoCrossesThePcieLink) {
  // A40 preset: PCIe bus 24 GB/s; the all-to-all gets 12 GB/s / 8 GPUs = 1.5 GB/s, i.e.
  // 1.5 / 24 = 0.0625 of the PCIe link: both rates 1 / 1.0625.
  const CoRun run =
      co_run(cluster_preset("a40"), test::local_all_gather(), test::cross_all_to_all());
  EXPECT_NEAR(run.rates.rate_a, 1 / 1.0625, 1e-12);
  EXPECT_NEAR(run.rates.rate_b, 1 / 1.0625, 1e-12);
}

// The DHelix paper's Figure 4 pattern, on every preset of its testbeds.
class InterferencePattern : public testing::TestWithParam<const char*> {};

TEST_P(InterferencePattern, MatchesThePapersFigure4) {
  const ClusterSpec cluster = cluster_preset(GetParam());
  const Op gemm = test::fc1_gemm();
  const Op fa = test::flash_attention(Pass::kForward);
  const Op fa_bwd = test::flash_attention(Pass::kBackward);
  const Op c1 = test::local_all_gather();
  const Op c2 = test::cross_all_to_all();
  // Compute with compute: badly (at or below 0).
  EXPECT_LE(co_run(cluster, gemm, gemm).oef, 0.0);
  EXPECT_LE(co_run(cluster, gemm, fa).oef, 0.0);
  EXPECT_LT(co_run(cluster, fa_bwd, gemm).oef, co_run(cluster, gemm, gemm).oef);
  // Compute with communication: well.
  for (const Op* compute : {&gemm, &fa, &fa_bwd}) {
    EXPECT_GE(co_run(cluster, *compute, c1).oef, 0.6) << compute->id;
    EXPECT_GE(co_run(cluster, *compute, c2).oef, 0.6) << compute->id;
  }
  // Local with cross-node communication: well; a collective with itself: badly.
  EXPECT_GE(co_run(cluster, c1, c2).oef, 0.8);
  EXPECT_LE(co_run(cluster, c1, c1).oef, 0.05);
  EXPECT_LE(co_run(cluster, c2, c2).oef, 0.05);
  // The row of docs/cost-model.md's OEF table.
  std::printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", GetParam(),
              co_run(cluster, gemm, gemm).oef, co_run(cluster, gemm, fa).oef,
              co_run(cluster, fa_bwd, gemm).oef, co_run(cluster, gemm, c1).oef,
              co_run(cluster, fa, c1).oef, co_run(cluster, gemm, c2).oef,
              co_run(cluster, c1, c2).oef, co_run(cluster, c1, c1).oef);
  std::printf("| %s solo us | GEMM %.1f | FA %.1f | FA_bwd %.1f | C1 %.1f | C2 %.1f |\n",
              GetParam(), op_time_us(cluster, gemm), op_time_us(cluster, fa),
              op_time_us(cluster, fa_bwd), op_time_us(cluster, c1), op_time_us(cluster, c2));
}

INSTANTIATE_TEST_SUITE_P(Presets, InterferencePattern, testing::Values("a40", "a800", "h100"));

}  // namespace
}  // namespace dhelix
