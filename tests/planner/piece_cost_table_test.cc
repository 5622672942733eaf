// The piece cost memo (planner/piece_cost_table.h) in both layouts answers every request
// as the block model does: exact costs bit for bit, and for a request with a threshold
// either the exact cost below it or a value at or above it that the cost reaches.
#include "planner/piece_cost_table.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "planner/co_run_model.h"
#include "planner/pairing_search.h"

namespace dhelix {
namespace {

StrandGraph draw(std::mt19937_64& rng, const std::string& prefix, int n) {
  std::uniform_real_distribution<double> unit(0, 1);
  StrandGraph g;
  for (int i = 0; i < n; ++i) {
    std::vector<int64_t> preds;
    for (int p = 0; p < i; ++p) {
      if (unit(rng) < 0.35) preds.push_back(p);
    }
    const double u = unit(rng);
    const StreamClass stream = u < 0.5    ? StreamClass::kCompute
                               : u < 0.75 ? StreamClass::kLocalComm
                                          : StreamClass::kCrossComm;
    g.add_op(prefix + std::to_string(i), stream, 1 + std::floor(unit(rng) * 30), preds);
  }
  return g;
}

TEST(PieceCostTable, DenseAndHashedLayoutsAnswerAsTheModel) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> unit(0, 1);
  int64_t requests = 0, bounded = 0;
  for (int c = 0; c < 12; ++c) {
    const StrandGraph f = draw(rng, "f", 7);
    const StrandGraph b = draw(rng, "b", 6);
    TableCoRunModel rates(0.85);
    const BlockCostModel model(f, b, rates);
    const PairingOptions options;
    Lattice lf = lattice_downsets(model, Strand::kForward, options);
    Lattice lb = lattice_downsets(model, Strand::kBackward, options);
    build_lattice_steps(model, options, &lf);
    build_lattice_steps(model, options, &lb);
    PieceCostTable dense(model, lf, lb);
    PieceCostTable hashed(model, lf, lb, 0);
    ASSERT_TRUE(dense.dense());
    ASSERT_FALSE(hashed.dense());
    // Every pair twice with a random threshold, then once without: the second request
    // meets the entry the first left (a bound or the cost).
    for (int round = 0; round < 3; ++round) {
      for (size_t x = 0; x < lf.pieces.size(); ++x) {
        for (size_t y = 0; y < lb.pieces.size(); ++y) {
          const double p = model.cost_us(lf.pieces[x], lb.pieces[y]);
          const double give_up = round < 2 ? p * (0.5 + unit(rng)) : BlockCostModel::kNoGiveUp;
          for (PieceCostTable* table : {&dense, &hashed}) {
            const double got =
                table->cost_us(static_cast<int64_t>(x), static_cast<int64_t>(y), give_up);
            ++requests;
            if (got < give_up) {
              ASSERT_EQ(got, p) << "case " << c << " pieces " << x << ", " << y;
            } else {
              ++bounded;
              ASSERT_LE(got, p * (1 + 1e-12)) << "case " << c << " pieces " << x << ", " << y;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(requests, 5000);
  EXPECT_GT(bounded, 500);  // thresholds below the cost were met, and bounds returned
}

}  // namespace
}  // namespace dhelix
