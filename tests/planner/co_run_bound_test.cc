// The slow-down aware block bound (planner/co_run_bound.h) and the early stop of the
// block simulation it allows (BlockCostModel::bounded_cost_us): the worked case by hand,
// and on random blocks that the bound never exceeds the simulated time and that a stopped
// simulation reports a true lower bound.
#include "planner/co_run_bound.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "planner/co_run_model.h"
#include "planner/segment_cost.h"
#include "planner/strand_graph.h"

namespace dhelix {
namespace {

TEST(CoRunBound, WorkedCaseTwoStreams) {
  // compute (0) beside local comm (1): 0.88; comm beside compute: 0.90. No cross comm.
  const CoRunLoadBound bound({{{1, 0.88, 0}, {0.90, 1, 0}, {0, 0, 1}}});
  // 100 us of compute and 30 us of comm: 100 + (1 - 0.88) / 0.90 * 30 = 104.
  EXPECT_NEAR(bound.bound_us({100, 30, 0}), 104, 1e-9);
  // One stream alone: its load.
  EXPECT_EQ(bound.bound_us({100, 0, 0}), 100);
  EXPECT_EQ(bound.bound_us({0, 0, 7}), 7);
  // No slow-downs at all: the plain bound.
  const CoRunLoadBound plain({{{1, 1, 1}, {1, 1, 1}, {1, 1, 1}}});
  EXPECT_EQ(plain.bound_us({100, 30, 5}), 100);
  EXPECT_EQ(plain.vertices().size(), 3u);
}

TEST(CoRunBound, GemmWithAllGatherIsBoundedBelowItsTime) {
  StrandGraph f, b;
  f.add_op("gemm", StreamClass::kCompute, 100, {});
  b.add_op("all_gather", StreamClass::kLocalComm, 40, {});
  TableCoRunModel rates;
  rates.set_pair("gemm", "all_gather", 0.8, 0.9);
  const BlockCostModel model(f, b, rates);
  // P = 100 + 0.2 * 40 / 0.9 = 108.89 (segment_cost_test); the bound: 100 + 0.2 / 0.9 *
  // 40, the same here, since the all-gather overlaps the GEMM completely.
  EXPECT_NEAR(model.load_bound().bound_us({100, 40, 0}), 100 + 0.2 / 0.9 * 40, 1e-9);
  EXPECT_LE(model.load_bound().bound_us({100, 40, 0}), model.cost_us(1, 1) * (1 + 1e-12));
}

StrandGraph random_graph(std::mt19937_64& rng, const std::string& prefix, int64_t n) {
  std::uniform_real_distribution<double> unit(0, 1);
  StrandGraph g;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> preds;
    for (int64_t p = 0; p < i; ++p) {
      if (unit(rng) < 0.3) preds.push_back(p);
    }
    const double u = unit(rng);
    const StreamClass stream = u < 0.5    ? StreamClass::kCompute
                               : u < 0.75 ? StreamClass::kLocalComm
                                          : StreamClass::kCrossComm;
    g.add_op(prefix + std::to_string(i), stream, unit(rng) < 0.1 ? 0.0 : 1 + 40 * unit(rng), preds);
  }
  return g;
}

std::array<double, 3> loads(const StrandGraph& g, OpMask ops) {
  std::array<double, 3> load{};
  for (int64_t i = 0; i < g.size(); ++i) {
    if (((ops >> i) & 1) != 0) load[static_cast<int>(g.op(i).stream)] += g.op(i).solo_time_us;
  }
  return load;
}

// 400 random blocks (any op sets, any rates): bound <= P, and a simulation stopped at any
// give-up time returns P itself below it and a lower bound on P at or above it.
TEST(CoRunBound, NeverAboveTheSimulatedTimeOnRandomBlocks) {
  std::mt19937_64 rng(20261125);
  std::uniform_real_distribution<double> unit(0, 1);
  int stopped_early = 0;
  for (int c = 0; c < 400; ++c) {
    const StrandGraph f = random_graph(rng, "f", 1 + static_cast<int64_t>(unit(rng) * 9));
    const StrandGraph b = random_graph(rng, "b", 1 + static_cast<int64_t>(unit(rng) * 9));
    TableCoRunModel rates;
    for (const StrandGraph* x : {&f, &b}) {
      for (const StrandGraph* y : {&f, &b}) {
        for (int64_t i = 0; i < x->size(); ++i) {
          for (int64_t j = 0; j < y->size(); ++j) {
            const double r = unit(rng) < 0.2 ? 1.0 : 0.05 + 0.95 * unit(rng);
            rates.set_rate(x->op(i).cost_key, y->op(j).cost_key, r);
          }
        }
      }
    }
    const BlockCostModel model(f, b, rates);
    const OpMask fo = static_cast<OpMask>(rng()) & f.all_ops();
    const OpMask bo = static_cast<OpMask>(rng()) & b.all_ops();
    const double p = model.cost_us(fo, bo);
    std::array<double, 3> load = loads(f, fo);
    const std::array<double, 3> lb = loads(b, bo);
    for (int s = 0; s < 3; ++s) load[s] += lb[s];
    EXPECT_LE(model.load_bound().bound_us(load), p * (1 + 1e-12)) << "case " << c;
    EXPECT_GE(model.load_bound().bound_us(load), std::max({load[0], load[1], load[2]}));

    std::array<double, kMaxStrandOps> fp, bp;
    const BlockSide fs = model.prepare_side(Strand::kForward, fo, fp.data());
    const BlockSide bs = model.prepare_side(Strand::kBackward, bo, bp.data());
    for (double fraction : {0.0, 0.5, 0.9, 0.99, 1.0, 1.5}) {
      const double give_up = fraction * p;
      bool exact = true;
      const double got = model.bounded_cost_us(fs, bs, give_up, &exact);
      if (got < give_up) {
        EXPECT_TRUE(exact);
        EXPECT_EQ(got, p);
      } else if (exact) {
        EXPECT_EQ(got, p);
      } else {
        ++stopped_early;
        EXPECT_LE(got, p * (1 + 1e-12)) << "case " << c << " give up " << give_up;
      }
    }
  }
  EXPECT_GT(stopped_early, 100);  // the early stop is exercised
}

}  // namespace
}  // namespace dhelix
