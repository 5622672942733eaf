// Block costs computed by hand. Notation: F = forward ops in the block, B = backward ops;
// "c" compute, "l" local comm, "x" cross comm; times in us.
#include "planner/segment_cost.h"

#include <algorithm>

#include <gtest/gtest.h>

#include "planner/co_run_model.h"
#include "planner/strand_graph.h"

namespace dhelix {
namespace {

constexpr StreamClass kC = StreamClass::kCompute;
constexpr StreamClass kL = StreamClass::kLocalComm;
constexpr StreamClass kX = StreamClass::kCrossComm;

// Finds one op's timing in a simulation.
OpTiming timing_of(const BlockSimulation& sim, Strand strand, int64_t op) {
  for (const OpTiming& t : sim.ops) {
    if (t.strand == strand && t.op == op) return t;
  }
  ADD_FAILURE() << "op not in simulation";
  return {};
}

TEST(SegmentCost, GemmWithAllGatherAtMeasuredRates) {
  StrandGraph f, b;
  f.add_op("gemm", kC, 100, {});
  b.add_op("all_gather", kL, 40, {});
  TableCoRunModel rates;
  rates.set_pair("gemm", "all_gather", 0.8, 0.9);
  const BlockCostModel model(f, b, rates);
  // Both start at 0. The all-gather ends at 40 / 0.9 = 44.44; the GEMM has done
  // 0.8 * 44.44 = 35.56 by then and runs the remaining 64.44 alone:
  // 44.44 + 64.44 = 100 + 0.2 * 40 / 0.9 = 108.89.
  const BlockSimulation sim = model.simulate(1, 1);
  EXPECT_NEAR(sim.time_us, 100 + 0.2 * 40 / 0.9, 1e-9);
  EXPECT_NEAR(timing_of(sim, Strand::kBackward, 0).finish_us, 40 / 0.9, 1e-9);
  EXPECT_EQ(timing_of(sim, Strand::kForward, 0).start_us, 0);
  // Alone, each takes its solo time.
  EXPECT_EQ(model.cost_us(1, 0), 100);
  EXPECT_EQ(model.cost_us(0, 1), 40);
  EXPECT_EQ(model.cost_us(0, 0), 0);
}

// The launch interval of planner/block_launch.h: a paired block (ops of both strands)
// starts its ops 20 us late, and its all-gather one more launch later, after the GEMM's; a
// strand alone does not. The GEMM runs alone [20, 40] (20 us of work), then beside the
// all-gather at the rates above: the all-gather ends at 40 + 40 / 0.9 = 84.44, the GEMM has
// done 20 + 0.8 * 44.44 and ends at 20 + 100 + 0.2 * 40 / 0.9 = 128.89.
TEST(SegmentCost, PairedBlockStartsAfterItsLaunchInterval) {
  StrandGraph f, b;
  f.add_op("gemm", kC, 100, {});
  b.add_op("all_gather", kL, 40, {});
  TableCoRunModel rates;
  rates.set_pair("gemm", "all_gather", 0.8, 0.9);
  const BlockCostModel model(f, b, rates, {}, 20);
  const BlockSimulation sim = model.simulate(1, 1);
  EXPECT_NEAR(sim.time_us, 20 + 100 + 0.2 * 40 / 0.9, 1e-9);
  EXPECT_EQ(timing_of(sim, Strand::kForward, 0).start_us, 20);
  EXPECT_EQ(timing_of(sim, Strand::kBackward, 0).start_us, 40);
  EXPECT_NEAR(timing_of(sim, Strand::kBackward, 0).finish_us, 40 + 40 / 0.9, 1e-9);
  EXPECT_NEAR(model.cost_us(1, 1), sim.time_us, 1e-9);
  EXPECT_EQ(model.cost_us(1, 0), 100);
  EXPECT_EQ(model.cost_us(0, 1), 40);
  EXPECT_EQ(model.cost_us(0, 0), 0);
}

// With a launch interval the host launches a paired block's compute ops before its
// collectives (the prototype's block lists compute, then communication): with 2 compute ops
// and a 10 us interval the compute starts at 10 and the collective at 10 * (1 + 2) = 30.
// Compute f0 (50 us) then b0 (40 us) serialise on the compute stream: 10 + 50 + 40 = 100;
// the all-gather (30 us, no slowdown) runs [30, 60]. A block without the other strand's
// compute, the all-gather beside f0 only: 10 + 50 = 60 for f0, the all-gather from
// 10 * (1 + 1) = 20 to 50.
TEST(SegmentCost, CollectivesOfAPairedBlockWaitForTheComputeLaunches) {
  StrandGraph f, b;
  f.add_op("f0", kC, 50, {});
  b.add_op("b0", kC, 40, {});
  b.add_op("ag", kL, 30, {});
  const NoSlowdownModel none;
  const BlockCostModel model(f, b, none, {}, 10);
  const BlockSimulation both = model.simulate(1, 3);
  EXPECT_DOUBLE_EQ(both.time_us, 100);
  EXPECT_DOUBLE_EQ(timing_of(both, Strand::kBackward, 1).start_us, 30);
  EXPECT_DOUBLE_EQ(timing_of(both, Strand::kBackward, 1).finish_us, 60);
  const BlockSimulation one = model.simulate(1, 2);
  EXPECT_DOUBLE_EQ(one.time_us, 60);
  EXPECT_DOUBLE_EQ(timing_of(one, Strand::kBackward, 1).start_us, 20);
  // A strand alone pays nothing: b0 and the all-gather side by side from 0.
  EXPECT_DOUBLE_EQ(model.cost_us(0, 3), 40);
}

// The host launches one op per interval: compute op k (from 0) no earlier than g · (k + 1),
// collective j no earlier than g · (1 + compute ops + j). Kernels shorter than the interval
// leave the GPU waiting. g = 20; compute f0 (5 us), b0 (5 us), b1 (5 us, after b0); two
// all-gathers of 10 us, a0 (forward, on the local stream) and x0 (backward, on the cross
// stream), no slowdown. Priorities: b0 (path 10) first, then f0 and b1 (5 each, ties to the
// backward strand). Compute: b0 [20, 25], then b1 waits for launch 2 at 40: [40, 45], f0 for
// launch 3 at 60: [60, 65]. Collectives: the first at 20 · (1 + 3) = 80, the
// second at 100: [80, 90] and [100, 110]. The block: 110 us.
TEST(SegmentCost, HostLaunchesOneOpPerInterval) {
  StrandGraph f, b;
  f.add_op("f0", kC, 5, {});
  f.add_op("a0", kL, 10, {});
  b.add_op("b0", kC, 5, {});
  b.add_op("b1", kC, 5, {0});
  b.add_op("x0", kX, 10, {});
  const NoSlowdownModel none;
  const BlockCostModel model(f, b, none, {}, 20);
  const BlockSimulation sim = model.simulate(3, 7);
  EXPECT_DOUBLE_EQ(sim.time_us, 110);
  EXPECT_DOUBLE_EQ(timing_of(sim, Strand::kBackward, 0).start_us, 20);
  EXPECT_DOUBLE_EQ(timing_of(sim, Strand::kBackward, 1).start_us, 40);
  EXPECT_DOUBLE_EQ(timing_of(sim, Strand::kForward, 0).start_us, 60);
  const double first_comm = std::min(timing_of(sim, Strand::kForward, 1).start_us,
                                     timing_of(sim, Strand::kBackward, 2).start_us);
  const double second_comm = std::max(timing_of(sim, Strand::kForward, 1).start_us,
                                      timing_of(sim, Strand::kBackward, 2).start_us);
  EXPECT_DOUBLE_EQ(first_comm, 80);
  EXPECT_DOUBLE_EQ(second_comm, 100);
  EXPECT_DOUBLE_EQ(model.cost_us(3, 7), 110);
  // A strand alone launches nothing ahead of the GPU: b0, b1 and x0 from 0, 10 us.
  EXPECT_DOUBLE_EQ(model.cost_us(0, 7), 10);
}

TEST(SegmentCost, TwoComputeOpsSerialiseLongestFirst) {
  StrandGraph f, b;
  f.add_op("f", kC, 30, {});
  b.add_op("b", kC, 50, {});
  const NoSlowdownModel none;
  const BlockCostModel model(f, b, none);
  // One compute stream: 30 + 50. The backward op has the longer path, so it goes first.
  const BlockSimulation sim = model.simulate(1, 1);
  EXPECT_EQ(sim.time_us, 80);
  EXPECT_EQ(timing_of(sim, Strand::kBackward, 0).start_us, 0);
  EXPECT_EQ(timing_of(sim, Strand::kForward, 0).start_us, 50);
}

TEST(SegmentCost, EqualPrioritiesGoToTheBackwardStrand) {
  StrandGraph f, b;
  f.add_op("f", kC, 10, {});
  b.add_op("b", kC, 10, {});
  const NoSlowdownModel none;
  const BlockSimulation sim = BlockCostModel(f, b, none).simulate(1, 1);
  ASSERT_EQ(sim.ops.size(), 2u);
  EXPECT_EQ(sim.ops[0].strand, Strand::kBackward);
  EXPECT_EQ(sim.ops[1].start_us, 10);
}

TEST(SegmentCost, CommOnTheSameStreamSerialises) {
  StrandGraph f, b;
  f.add_op("rs", kL, 20, {});
  b.add_op("ag", kL, 30, {});
  const NoSlowdownModel none;
  EXPECT_EQ(BlockCostModel(f, b, none).cost_us(1, 1), 50);  // 20 + 30 on one stream
}

TEST(SegmentCost, LocalAndCrossCommOverlap) {
  StrandGraph f, b;
  f.add_op("ag", kL, 20, {});
  b.add_op("send", kX, 30, {});
  const NoSlowdownModel none;
  EXPECT_EQ(BlockCostModel(f, b, none).cost_us(1, 1), 30);  // max(20, 30)
  // The all-gather at half speed while the send runs: by 30 it has done 15, then 5 alone.
  TableCoRunModel rates;
  rates.set_rate("ag", "send", 0.5);
  EXPECT_NEAR(BlockCostModel(f, b, rates).cost_us(1, 1), 35, 1e-12);
}

TEST(SegmentCost, SelfOverlapWithinOneStrand) {
  StrandGraph independent, dependent, empty;
  independent.add_op("gemm", kC, 50, {});
  independent.add_op("ag", kL, 30, {});
  dependent.add_op("gemm", kC, 50, {});
  dependent.add_op("ag", kL, 30, {0});
  const NoSlowdownModel none;
  // P(F, {}): independent ops of one strand overlap (50), dependent ones do not (80).
  EXPECT_EQ(BlockCostModel(independent, empty, none).cost_us(3, 0), 50);
  EXPECT_EQ(BlockCostModel(dependent, empty, none).cost_us(3, 0), 80);
  // The same holds for the backward side.
  EXPECT_EQ(BlockCostModel(empty, independent, none).cost_us(0, 3), 50);
}

TEST(SegmentCost, DependenciesAndCriticalPathPriority) {
  // F: f0 (c 10) -> f1 (l 40); B: b0 (c 30). Priorities: f0 10 + 40 = 50 > b0 30, so f0
  // runs first (0-10), then f1 on the comm stream (10-50) beside b0 (10-40): 50.
  // (b0 first would give 30 + 10 + 40 = 80.)
  StrandGraph f, b;
  f.add_op("f0", kC, 10, {});
  f.add_op("f1", kL, 40, {0});
  b.add_op("b0", kC, 30, {});
  const NoSlowdownModel none;
  const BlockSimulation sim = BlockCostModel(f, b, none).simulate(3, 1);
  EXPECT_EQ(sim.time_us, 50);
  EXPECT_EQ(timing_of(sim, Strand::kForward, 1).start_us, 10);
  EXPECT_EQ(timing_of(sim, Strand::kBackward, 0).start_us, 10);
  EXPECT_EQ(timing_of(sim, Strand::kBackward, 0).finish_us, 40);
}

TEST(SegmentCost, ReadyOpNeverWaitsForAMoreUrgentOneNotYetReady) {
  // F: f0 (l 10) -> f1 (c 20) -> f2 (l 25); B: b0 (c 30). At 0 only b0 is ready on the
  // compute stream, so it runs 0-30 although f1 (path 45) will be ready at 10:
  // f1 30-50, f2 50-75.
  StrandGraph f, b;
  f.add_op("f0", kL, 10, {});
  f.add_op("f1", kC, 20, {0});
  f.add_op("f2", kL, 25, {1});
  b.add_op("b0", kC, 30, {});
  const NoSlowdownModel none;
  EXPECT_EQ(BlockCostModel(f, b, none).cost_us(7, 1), 75);
}

TEST(SegmentCost, PredecessorsOutsideTheBlockCountAsDone) {
  StrandGraph f, b;
  f.add_op("f0", kC, 10, {});
  f.add_op("f1", kL, 40, {0});
  b.add_op("b0", kC, 30, {});
  const NoSlowdownModel none;
  EXPECT_EQ(BlockCostModel(f, b, none).cost_us(2, 1), 40);  // f1 and b0 from 0
}

TEST(SegmentCost, ThreeConcurrentOpsMultiplyPairRates) {
  // F: gemm (c 100) and send (x 60), independent; B: ag (l 40).
  StrandGraph f, b;
  f.add_op("gemm", kC, 100, {});
  f.add_op("send", kX, 60, {});
  b.add_op("ag", kL, 40, {});
  TableCoRunModel rates;
  rates.set_pair("gemm", "ag", 0.8, 0.9);
  rates.set_pair("gemm", "send", 0.9, 0.95);
  // All three from 0: gemm at 0.8 * 0.9 = 0.72, ag at 0.9 * 1 = 0.9, send at 0.95.
  // ag ends at t1 = 40 / 0.9. Then gemm at 0.9 and send at 0.95 until send ends at
  // t2 = 60 / 0.95 (its rate never changed). gemm has done 0.72 t1 + 0.9 (t2 - t1) and
  // ends at t2 + 100 - 0.72 t1 - 0.9 (t2 - t1) = 100 + 0.1 t2 + 0.18 t1 = 114.3158.
  const double t1 = 40 / 0.9, t2 = 60 / 0.95;
  const BlockSimulation sim = BlockCostModel(f, b, rates).simulate(3, 1);
  EXPECT_NEAR(sim.time_us, 100 + 0.1 * t2 + 0.18 * t1, 1e-9);
  EXPECT_NEAR(timing_of(sim, Strand::kBackward, 0).finish_us, t1, 1e-9);
  EXPECT_NEAR(timing_of(sim, Strand::kForward, 1).finish_us, t2, 1e-9);
}

TEST(SegmentCost, TimingsListEveryOpInStartOrder) {
  StrandGraph f, b;
  f.add_op("f0", kL, 10, {});
  f.add_op("f1", kC, 20, {0});
  b.add_op("b0", kC, 5, {});
  const NoSlowdownModel none;
  const BlockSimulation sim = BlockCostModel(f, b, none).simulate(3, 1);
  ASSERT_EQ(sim.ops.size(), 3u);
  EXPECT_EQ(sim.ops[0].strand, Strand::kBackward);  // b0 and f0 both at 0: backward first
  EXPECT_EQ(sim.ops[1].op, 0);
  EXPECT_EQ(sim.ops[2].op, 1);
  EXPECT_EQ(sim.ops[2].start_us, 10);
  EXPECT_EQ(sim.time_us, 30);
}

TEST(CoRunModel, RatesFromPairFinishTimes) {
  // The GEMM/all-gather pair above: finishes at 108.89 and 44.44 give back 0.8 and 0.9.
  auto [rate_gemm, rate_ag] =
      rates_from_pair_finish_times(100, 40, PairFinishTimes{100 + 0.2 * 40 / 0.9, 40 / 0.9});
  EXPECT_NEAR(rate_gemm, 0.8, 1e-12);
  EXPECT_NEAR(rate_ag, 0.9, 1e-12);
  // Order of the arguments does not matter.
  auto [a, b] = rates_from_pair_finish_times(40, 100, PairFinishTimes{40 / 0.9, 108.0 + 8 / 9.0});
  EXPECT_NEAR(a, 0.9, 1e-12);
  EXPECT_NEAR(b, 0.8, 1e-12);
  // No slowdown measured: rate 1; a faster-than-solo measurement is clamped to 1.
  EXPECT_EQ(rates_from_pair_finish_times(10, 20, PairFinishTimes{10, 20}).first, 1.0);
  EXPECT_EQ(rates_from_pair_finish_times(10, 20, PairFinishTimes{9, 20}).first, 1.0);
}

TEST(CoRunModel, PairTimesAdapterFeedsTheSimulation) {
  StrandGraph f, b;
  f.add_op("gemm", kC, 100, {});
  b.add_op("all_gather", kL, 40, {});
  const PairTimesCoRunModel measured([](const StrandOp& x, const StrandOp&) {
    const bool gemm_first = x.id == "gemm";
    const PairFinishTimes gemm_ag{100 + 0.2 * 40 / 0.9, 40 / 0.9};
    return std::optional<PairFinishTimes>(
        gemm_first ? gemm_ag : PairFinishTimes{gemm_ag.finish_b_us, gemm_ag.finish_a_us});
  });
  EXPECT_NEAR(BlockCostModel(f, b, measured).cost_us(1, 1), 100 + 0.2 * 40 / 0.9, 1e-9);
}

}  // namespace
}  // namespace dhelix
