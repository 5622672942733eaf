#include "profiler/collective_cost.h"

#include <gtest/gtest.h>

#include "lib/cluster_reader.h"
#include "tests/profiler/llama70b_ops.h"

namespace dhelix {
namespace {

using test::a100_like_cluster;
using test::comm_op;
using test::kActivationBytes;

TEST(CollectiveCost, BusBandwidthFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(OpKind::kAllReduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(OpKind::kAllGather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(OpKind::kReduceScatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(OpKind::kAllToAll, 2), 1.0 / 2);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(OpKind::kSendRecv, 2), 1.0);
  EXPECT_EQ(latency_steps(OpKind::kAllReduce, 8), 14);
  EXPECT_EQ(latency_steps(OpKind::kAllGather, 8), 7);
  EXPECT_EQ(latency_steps(OpKind::kSendRecv, 2), 1);
}

TEST(CollectiveCost, LocalRingTimes) {
  // S = 67,108,864 bytes, B = 232 GB/s = 232,000 bytes/us, alpha = 9 us, n = 8.
  // all-reduce: 14 * 9 + 1.75 * S / 232,000 = 126 + 506.2091 = 632.2091 us
  // all-gather:  7 * 9 + 0.875 * S / 232,000 = 63 + 253.1046 = 316.1046 us
  const ClusterSpec cluster = a100_like_cluster();
  EXPECT_NEAR(collective_time_us(cluster, comm_op("ar", OpKind::kAllReduce, kActivationBytes, 8,
                                                  GroupScope::kLocal, 1)),
              632.2091, 1e-3);
  EXPECT_NEAR(collective_time_us(cluster, test::local_all_gather()), 316.1046, 1e-3);
  EXPECT_EQ(collective_time_us(cluster, comm_op("one", OpKind::kAllGather, kActivationBytes, 1,
                                                GroupScope::kLocal, 1)),
            0);
}

TEST(CollectiveCost, CrossNodeGroupsGetTheirShareOfTheNics) {
  // 4 NICs of 24 GB/s for 8 GPUs: 12 GB/s per GPU; alpha = max(5, 9) = 9 us.
  // all-gather: 63 + 0.875 * S / 12,000 = 63 + 4893.3547 = 4956.3547 us
  // send/recv:   9 + S / 12,000 = 9 + 5592.4053 = 5601.4053 us
  const ClusterSpec cluster = a100_like_cluster();
  const Op ag = comm_op("ag", OpKind::kAllGather, kActivationBytes, 8, GroupScope::kCrossNode, 8);
  EXPECT_DOUBLE_EQ(collective_link(cluster, ag).bus_bandwidth_gbps, 12.0);
  EXPECT_TRUE(collective_link(cluster, ag).network);
  EXPECT_NEAR(collective_time_us(cluster, ag), 4956.3547, 1e-3);
  const Op p2p = comm_op("pp", OpKind::kSendRecv, kActivationBytes, 2, GroupScope::kCrossNode, 2);
  EXPECT_NEAR(collective_time_us(cluster, p2p), 5601.4053, 1e-3);
}

TEST(CollectiveCost, AGroupFillingItsNodesAggregatesEveryRail) {
  // 4 NICs of 24 GB/s, 8 GPUs a node. TP 16 over 2 nodes: m = 8 members a node, the only
  // group crossing, so all 4 rails: 4 * 24 * 8/8 = 96 GB/s. 16 ranks over 4 nodes: m = 4,
  // two groups share a node: 48 GB/s. 8 ranks over 8 nodes (DP, PP): m = 1, 12 GB/s.
  // Capped by the intra-node bus bandwidth: with 16 NICs m = 8 gives 384 > 232, so 232.
  // TP 16 all-gather of S on 2 nodes: 15 * 9 us + (15/16) * S / 96,000 B/us.
  ClusterSpec cluster = a100_like_cluster();
  EXPECT_DOUBLE_EQ(cross_node_bus_bandwidth_gbps(cluster, 16, 2), 96.0);
  EXPECT_DOUBLE_EQ(cross_node_bus_bandwidth_gbps(cluster, 16, 4), 48.0);
  EXPECT_DOUBLE_EQ(cross_node_bus_bandwidth_gbps(cluster, 8, 8), 12.0);
  const Op tp16 =
      comm_op("ag", OpKind::kAllGather, kActivationBytes, 16, GroupScope::kCrossNode, 2);
  EXPECT_DOUBLE_EQ(collective_link(cluster, tp16).bus_bandwidth_gbps, 96.0);
  EXPECT_NEAR(collective_time_us(cluster, tp16),
              15 * 9.0 + 15.0 / 16.0 * static_cast<double>(kActivationBytes) / 96'000.0, 1e-6);
  cluster.nics_per_node = 16;
  EXPECT_DOUBLE_EQ(collective_link(cluster, tp16).bus_bandwidth_gbps, 232.0);
}

TEST(CollectiveCost, CrossNodeAllToAllGetsAtMostOneNicPerGpu) {
  // 16 NICs of 24 GB/s for 8 GPUs would give 48 GB/s per GPU; all-to-all keeps 24.
  ClusterSpec cluster = a100_like_cluster();
  cluster.nics_per_node = 16;
  const Op ag = comm_op("ag", OpKind::kAllGather, kActivationBytes, 8, GroupScope::kCrossNode, 8);
  EXPECT_DOUBLE_EQ(collective_link(cluster, ag).bus_bandwidth_gbps, 48.0);
  EXPECT_DOUBLE_EQ(collective_link(cluster, test::cross_all_to_all()).bus_bandwidth_gbps, 24.0);
}

TEST(CollectiveCost, AlphaOfNineMicrosecondsPutsHalfPeakNear17MB) {
  // Half of B when the latency term equals the bandwidth term: S = n * alpha * B =
  // 8 * 9e-6 s * 232e9 B/s = 16,704,000 bytes (nccl-tests: half peak near 16-18 MB).
  const CollectiveLink link = collective_link(a100_like_cluster(), test::local_all_gather());
  EXPECT_NEAR(modelled_bus_bandwidth_gbps(OpKind::kAllReduce, 8, 16'704'000, link), 116.0, 1e-9);
  EXPECT_LT(modelled_bus_bandwidth_gbps(OpKind::kAllReduce, 8, 1 << 20, link), 30.0);
  EXPECT_GT(modelled_bus_bandwidth_gbps(OpKind::kAllReduce, 8, 1 << 30, link), 225.0);
}

TEST(CollectiveCost, PresetsReachHalfPeakBetweenOneAndTwentyMegabytes) {
  // With the presets' alpha half of the bus bandwidth comes at n * alpha * B: A800 8 * 9 us *
  // 160 GB/s = 11.5 MB, H100 8 * 5.5 us * 355 GB/s = 15.6 MB, near the measured 16-18 MB
  // (docs/presets.md, docs/cost-model.md "Known limits").
  for (const char* name : {"a800", "h100"}) {
    const ClusterSpec cluster = cluster_preset(name);
    const CollectiveLink link = collective_link(cluster, test::local_all_gather());
    const double half_bytes = 8 * link.latency_us * 1e-6 * link.bus_bandwidth_gbps * 1e9;
    EXPECT_NEAR(modelled_bus_bandwidth_gbps(OpKind::kAllReduce, 8, half_bytes, link),
                link.bus_bandwidth_gbps / 2, 1e-9)
        << name;
    EXPECT_GT(half_bytes, 1e6) << name;
    EXPECT_LT(half_bytes, 20e6) << name;
  }
}

}  // namespace
}  // namespace dhelix
