// --emulate-link's settings (runtime/comm/link_emulation.h) and the emulated link's
// arithmetic (runtime/comm/emulated_link.h): durations by hand, equal to the model
// backend's collective times on a cluster of the same link, and the per-direction
// serialisation of the header's worked example. The timing of real transfers under
// mpirun is tests/runtime/emulated_link_mpi_test.cc.

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "lib/cluster_spec.h"
#include "lib/error.h"
#include "lib/op_catalogue.h"
#include "profiler/collective_cost.h"
#include "runtime/comm/emulated_link.h"
#include "runtime/comm/link_emulation.h"
#include "tests/runtime/error_of.h"

namespace dhelix::rt {
namespace {

using std::chrono::nanoseconds;

TEST(LinkEmulation, OneSettingForEveryKindAndOverridesPerKind) {
  const LinkEmulation links = LinkEmulation::parse({"2gbit@20us", "pp=500mbit@0.5ms"});
  ASSERT_NE(links.rate(ParallelDim::kTp), nullptr);
  // 2 Gbit/s = 0.25 GB/s; 500 Mbit/s = 0.0625 GB/s.
  EXPECT_DOUBLE_EQ(links.rate(ParallelDim::kTp)->bus_bandwidth_gbps, 0.25);
  EXPECT_DOUBLE_EQ(links.rate(ParallelDim::kTp)->latency_us, 20);
  EXPECT_DOUBLE_EQ(links.rate(ParallelDim::kPp)->bus_bandwidth_gbps, 0.0625);
  EXPECT_DOUBLE_EQ(links.rate(ParallelDim::kPp)->latency_us, 500);
  EXPECT_EQ(links.describe(),
            "tp 2gbit@20us, cp 2gbit@20us, ep 2gbit@20us, dp 2gbit@20us, pp 500mbit@500us");
  EXPECT_TRUE(links.enabled());
  EXPECT_EQ(links.to_json()["pp"]["latency_us"], 500.0);
}

TEST(LinkEmulation, OnlyTheKindsNamedAreEmulated) {
  const LinkEmulation links = LinkEmulation::parse({"tp=100kbit"});
  EXPECT_DOUBLE_EQ(links.rate(ParallelDim::kTp)->bus_bandwidth_gbps, 100e3 / 8 / 1e9);
  EXPECT_DOUBLE_EQ(links.rate(ParallelDim::kTp)->latency_us, 0);
  EXPECT_EQ(links.rate(ParallelDim::kCp), nullptr);
  EXPECT_EQ(links.describe(), "tp 100kbit@0us");
  EXPECT_FALSE(LinkEmulation::parse({}).enabled());
  EXPECT_EQ(LinkEmulation().describe(), "");
}

TEST(LinkEmulation, BadValuesNameTheFlagTheValueAndTheRule) {
  const auto message = [](const std::string& value) {
    return test::error_of([&] { LinkEmulation::parse({value}); }).second;
  };
  EXPECT_EQ(message("tp=2gb"),
            "--emulate-link: 'tp=2gb' has rate '2gb': write a positive number of bits per second "
            "as tc does: 500mbit, 2gbit, 100kbit");
  EXPECT_EQ(message("0gbit"),
            "--emulate-link: '0gbit' has rate '0gbit': write a positive number of bits per second "
            "as tc does: 500mbit, 2gbit, 100kbit");
  EXPECT_EQ(message("xp=1gbit"),
            "--emulate-link: 'xp=1gbit' names the group kind 'xp': use one of tp, cp, ep, dp, "
            "pp, or leave KIND= out for every kind");
  EXPECT_EQ(message("1gbit@20"),
            "--emulate-link: '1gbit@20' has latency '20': write a number of microseconds or "
            "milliseconds after the @: 20us, 0.5ms");
  EXPECT_EQ(message("1gbit@-3us").substr(0, 41), "--emulate-link: '1gbit@-3us' has latency ");
  EXPECT_EQ(test::error_of([] {
              LinkEmulation::parse({"tp=1gbit", "tp=2gbit"});
            }).second,
            "--emulate-link: 'tp=2gbit' is a second setting for tp: give each kind once");
  EXPECT_EQ(test::error_of([] {
              LinkEmulation::parse({"1gbit", "2gbit"});
            }).second,
            "--emulate-link: '2gbit' is a second setting for every kind: give KIND= once each");
  EXPECT_EQ(test::error_of([] {
              LinkEmulation::parse({"1gbit", "2gbit"});
            }).first,
            ErrorCode::kInvalidInput);
}

TEST(EmulatedLink, DurationsAreTheRingAlgorithmsWireTime) {
  EmulatedLink link(LinkEmulation::parse({"2gbit@20us"}).rate(ParallelDim::kTp)[0]);
  // B = 250 bytes/us. All-gather of S = 1 MiB on 2 ranks: 20 + 524288 / 250 = 2117.152 us.
  EXPECT_EQ(link.duration(OpKind::kAllGather, 2, 1048576), nanoseconds(2117152));
  // Reduce-scatter on 4 ranks: 3 * 20 + 3/4 * 1048576 / 250 = 60 + 3145.728 = 3205.728 us.
  EXPECT_EQ(link.duration(OpKind::kReduceScatter, 4, 1048576), nanoseconds(3205728));
  // All-reduce on 4 ranks: 6 * 20 + 3/2 * 1048576 / 250 = 120 + 6291.456 = 6411.456 us.
  EXPECT_EQ(link.duration(OpKind::kAllReduce, 4, 1048576), nanoseconds(6411456));
  // Send of 250,000 bytes: 20 + 1000 = 1020 us.
  EXPECT_EQ(link.duration(OpKind::kSendRecv, 2, 250000), nanoseconds(1020000));
  EXPECT_EQ(link.duration(OpKind::kAllGather, 1, 1048576), nanoseconds(0));
}

TEST(EmulatedLink, AgreesWithTheModelBackendOnTheSameLink) {
  // A cluster whose local link is the emulated one: the model backend's time of every op
  // kind is the emulated duration, by construction (both are lib/link_cost.h).
  ClusterSpec cluster;
  cluster.intra_node.bus_bandwidth_gbps = 0.25;
  cluster.intra_node.latency_us = 20;
  EmulatedLink link(LinkRate{.bus_bandwidth_gbps = 0.25, .latency_us = 20, .text = "2gbit@20us"});
  for (const OpKind kind : {OpKind::kAllGather, OpKind::kReduceScatter, OpKind::kAllReduce,
                            OpKind::kAllToAll, OpKind::kSendRecv}) {
    for (const int64_t n : {2, 4}) {
      Op op;
      op.kind = kind;
      op.comm_bytes = 3 << 20;
      op.group_size = n;
      op.scope = GroupScope::kLocal;
      const double model_us = collective_time_us(cluster, op);
      EXPECT_NEAR(static_cast<double>(link.duration(kind, n, 3 << 20).count()) / 1e3, model_us,
                  1e-3)
          << op_kind_name(kind) << " n=" << n;
    }
  }
}

TEST(EmulatedLink, EachDirectionCarriesOneTransferAtATime) {
  // The header's worked example: an all-gather ready at 0 ends at 2117 us; a reduce-scatter
  // ready at 500 us waits for the link and ends at 4234 us; a receive (ingress only) that
  // could start at 0 waits for the ingress too; a send (egress only) after them starts when
  // the egress is free, and one after a long idle gap starts when it is ready.
  EmulatedLink link(LinkRate{.bus_bandwidth_gbps = 0.25, .latency_us = 20, .text = ""});
  const LinkClock::time_point zero{};
  const nanoseconds d = link.duration(OpKind::kAllGather, 2, 1048576);
  EXPECT_EQ(link.reserve(zero, d, true, true) - zero, nanoseconds(2117152));
  EXPECT_EQ(link.reserve(zero + nanoseconds(500000), d, true, true) - zero, nanoseconds(4234304));
  EXPECT_EQ(link.reserve(zero, nanoseconds(1000), false, true) - zero, nanoseconds(4235304));
  EXPECT_EQ(link.reserve(zero, nanoseconds(1000), true, false) - zero, nanoseconds(4235304));
  EXPECT_EQ(link.reserve(zero + nanoseconds(9000000), nanoseconds(1000), true, false) - zero,
            nanoseconds(9001000));
}

TEST(EmulatedLink, SleepsUntilTheDeadlineAndNotMuchLonger) {
  const LinkClock::time_point start = LinkClock::now();
  sleep_until_deadline(start + std::chrono::milliseconds(3));
  const auto slept = LinkClock::now() - start;
  EXPECT_GE(slept, std::chrono::milliseconds(3));
  // A loaded CI machine may wake the thread late; a poll would not be caught here, only an
  // early return.
  EXPECT_LT(slept, std::chrono::milliseconds(200));
}

TEST(EmulatedLink, CountsCallsThatReturnedAfterTheLinkWasDone) {
  EmulatedLink link(LinkRate{.bus_bandwidth_gbps = 0.25, .latency_us = 20, .text = ""});
  const LinkClock::time_point done{std::chrono::milliseconds(5)};
  link.record_return(done, done + std::chrono::microseconds(30));    // a prompt wake-up
  link.record_return(done, done + kLateReturn);                      // at the threshold
  link.record_return(done, done + std::chrono::microseconds(2500));  // late
  link.record_return(done, done + std::chrono::microseconds(500));   // late
  const LinkLateness l = link.lateness();
  EXPECT_EQ(l.transfers, 4);
  EXPECT_EQ(l.late, 2);
  EXPECT_DOUBLE_EQ(l.late_ms, 3.0);
  EXPECT_DOUBLE_EQ(l.max_late_ms, 2.5);

  EmulatedLink idle(LinkRate{.bus_bandwidth_gbps = 1, .latency_us = 0, .text = ""});
  idle.record_return(done, done);
  const std::vector<std::pair<ParallelDim, LinkLateness>> links = {
      {ParallelDim::kTp, l}, {ParallelDim::kCp, idle.lateness()}};
  EXPECT_EQ(lateness_text(links),
            "5 calls, 2 returned more than 100 us after its link (3.0 ms in all, the latest "
            "2.5 ms)");
  EXPECT_EQ(lateness_text({{ParallelDim::kCp, idle.lateness()}}),
            "1 call, none returned more than 100 us after its link");
  EXPECT_EQ(lateness_text({}), "");
  const OrderedJson json = lateness_to_json(links);
  EXPECT_EQ(json["tp"]["calls"], 4);
  EXPECT_EQ(json["tp"]["late"], 2);
  EXPECT_DOUBLE_EQ(json["tp"]["late_ms"].get<double>(), 3.0);
  EXPECT_EQ(json["cp"]["late"], 0);
  EXPECT_EQ(json["cp"]["late_threshold_us"], 100);
}

}  // namespace
}  // namespace dhelix::rt
