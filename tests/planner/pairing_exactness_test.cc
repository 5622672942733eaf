// The exactness proof by test: on random small DAG pairs with random streams, times and
// pairwise slowdowns, the downset DP's optimum equals the brute force over every
// topological order x segmentation x alignment, with and without pruning and segment
// bounds; and the DP's own blocks, re-simulated, add up to its optimum.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "planner/brute_force_pairing.h"
#include "planner/co_run_model.h"
#include "planner/pairing_search.h"

namespace dhelix {
namespace {

StrandGraph random_graph(std::mt19937_64& rng, const std::string& prefix, int64_t n,
                         double edge_probability) {
  std::uniform_real_distribution<double> unit(0, 1);
  std::uniform_int_distribution<int> time_us(0, 40);
  StrandGraph g;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> preds;
    for (int64_t p = 0; p < i; ++p) {
      if (unit(rng) < edge_probability) preds.push_back(p);
    }
    const double u = unit(rng);
    const StreamClass stream = u < 0.5    ? StreamClass::kCompute
                               : u < 0.75 ? StreamClass::kLocalComm
                                          : StreamClass::kCrossComm;
    // Mostly positive times, sometimes zero (empty ops must not break anything).
    g.add_op(prefix + std::to_string(i), stream, time_us(rng) == 0 ? 0.0 : 1 + time_us(rng), preds);
  }
  return g;
}

// Plans the brute force would enumerate, to keep each case small.
double plan_count(int64_t n, int64_t m) {
  std::vector<std::vector<double>> w(n + 1, std::vector<double>(m + 1, 0));
  for (int64_t i = 0; i <= n; ++i) {
    for (int64_t j = 0; j <= m; ++j) {
      if (i == 0 && j == 0) {
        w[i][j] = 1;
        continue;
      }
      for (int64_t a = 0; a <= i; ++a) {
        for (int64_t b = 0; b <= j; ++b) {
          if (a + b > 0) w[i][j] += w[i - a][j - b];
        }
      }
    }
  }
  return w[n][m];
}

TEST(PairingExactness, DownsetDpEqualsBruteForceOn240RandomPairs) {
  std::mt19937_64 rng(20240611);
  std::uniform_int_distribution<int> size(0, 6);
  std::uniform_real_distribution<double> unit(0, 1);
  int cases = 0, bounded_cases = 0, with_overlap_gain = 0, five_plus = 0;
  int64_t plans = 0;
  while (cases < 240) {
    const int64_t nf = size(rng), nb = size(rng);
    const double density = unit(rng) * 0.7;
    const StrandGraph f = random_graph(rng, "f", nf, density);
    const StrandGraph b = random_graph(rng, "b", nb, density);
    const double work = static_cast<double>(count_topological_orders(f)) *
                        static_cast<double>(count_topological_orders(b)) * plan_count(nf, nb);
    if (work > 3e6) continue;  // the brute force would be slow; draw again (deterministic)
    TableCoRunModel rates;
    for (const StrandOp& x : f.ops()) {
      for (const StrandOp& y : b.ops()) {
        if (unit(rng) < 0.5)
          rates.set_pair(x.id, y.id, 0.4 + 0.6 * unit(rng), 0.4 + 0.6 * unit(rng));
      }
    }
    for (const StrandGraph* g : {&f, &b}) {  // self-overlap slowdowns inside a strand too
      for (const StrandOp& x : g->ops()) {
        for (const StrandOp& y : g->ops()) {
          if (x.id < y.id && unit(rng) < 0.3) rates.set_pair(x.id, y.id, unit(rng) * 0.5 + 0.5, 1);
        }
      }
    }
    const BlockCostModel model(f, b, rates);
    const int64_t bound = unit(rng) < 0.3 ? 1 + static_cast<int64_t>(unit(rng) * 2) : 0;
    PairingOptions options;
    options.max_segment_ops = bound;
    const PairingResult dp = search_pairing(model, options);
    const BruteForceResult brute = brute_force_pairing(model, bound);
    const double tolerance = 1e-9 * std::max(1.0, brute.total_time_us);
    ASSERT_NEAR(dp.total_time_us, brute.total_time_us, tolerance)
        << "case " << cases << " nf=" << nf << " nb=" << nb << " bound=" << bound;
    ASSERT_NEAR(resimulate_total_us(model, dp.blocks), dp.total_time_us, tolerance);
    PairingOptions unpruned = options;
    unpruned.prune = false;
    ASSERT_NEAR(search_pairing(model, unpruned).total_time_us, dp.total_time_us, tolerance);
    // The naive reference (orders, then the paper's DP) is exact too.
    NaiveOptions naive;
    naive.max_segment_ops = bound;
    ASSERT_NEAR(naive_order_pairing(model, naive).total_time_us, dp.total_time_us, tolerance);
    ASSERT_LE(dp.total_time_us, dp.sequential_time_us + tolerance);
    ++cases;
    plans += brute.plans;
    five_plus += nf >= 5 && nb >= 5;
    bounded_cases += bound > 0;
    with_overlap_gain += dp.total_time_us < dp.sequential_time_us - tolerance;
  }
  // The draw exercises both bounded and unbounded searches, and real pairing gains.
  EXPECT_GT(bounded_cases, 30);
  EXPECT_GT(with_overlap_gain, 100);
  // ... and real brute-force work: millions of complete plans, some 5+ x 5+ op pairs.
  EXPECT_GT(plans, 1000000);
  EXPECT_GT(five_plus, 0);
  RecordProperty("brute_force_plans", std::to_string(plans));
}

}  // namespace
}  // namespace dhelix
