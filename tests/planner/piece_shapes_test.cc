// Piece shapes (planner/piece_shapes.h): ops are alike exactly when the simulation cannot
// tell them apart, and two op sets of one shape cost bit for bit the same beside every
// partner set, on drawn graphs built from few op kinds (where shapes repeat).
#include "planner/piece_shapes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "planner/co_run_model.h"
#include "planner/pairing_search.h"

namespace dhelix {
namespace {

// A CP-ring-like strand: all-gather, then `steps` x (send/recv -> attention step).
StrandGraph ring(const std::string& prefix, int steps, double attn_us) {
  StrandGraph g;
  g.add_op(prefix + "ag", StreamClass::kLocalComm, 8, {}, "ag");
  int64_t last_attn = -1;
  int64_t last_recv = 0;
  for (int k = 0; k < steps; ++k) {
    last_recv = g.add_op(prefix + "recv" + std::to_string(k), StreamClass::kCrossComm, 5,
                         {last_recv}, "recv");
    std::vector<int64_t> preds = {last_recv};
    if (last_attn >= 0) preds.push_back(last_attn);
    last_attn = g.add_op(prefix + "attn" + std::to_string(k), StreamClass::kCompute, attn_us, preds,
                         "attn");
  }
  return g;
}

TEST(PieceShapes, OpsAreAlikeWhenStreamTimeAndRatesAgree) {
  const StrandGraph f = ring("f.", 3, 20);
  StrandGraph b = ring("b.", 2, 30);
  b.add_op("b.late_attn", StreamClass::kCompute, 30, {4}, "late_attn");  // rates differ below
  TableCoRunModel rates(0.9);
  rates.set_rate("recv", "late_attn", 0.7);
  rates.set_rate("attn", "late_attn", 0.5);  // one stream: never read, not a difference
  const BlockCostModel model(f, b, rates);
  // f: ag, recv0, attn0, recv1, attn1, recv2, attn2: the ring's repeats are alike.
  EXPECT_EQ(op_classes(model, Strand::kForward), (std::vector<int32_t>{0, 1, 2, 1, 2, 1, 2}));
  // b: the last op has the attention's stream and time, but a send/recv runs at 0.7 beside
  // it, not 0.9: it is a class of its own. (Rates between ops of one stream do not count.)
  EXPECT_EQ(op_classes(model, Strand::kBackward), (std::vector<int32_t>{0, 1, 2, 1, 2, 5}));

  // Ops by index: ag 0, recv k = 1 + 2k, attn k = 2 + 2k.
  const auto ops = [](std::initializer_list<int> indices) {
    OpMask m = 0;
    for (int i : indices) m |= OpMask{1} << i;
    return m;
  };
  PieceShapes shapes(model, Strand::kForward);
  EXPECT_EQ(shapes.find_or_insert(ops({3, 4}), 1), 1);  // recv1 -> attn1
  EXPECT_EQ(shapes.find_or_insert(ops({5, 6}), 2), 1);  // recv2 -> attn2: the same shape
  EXPECT_EQ(shapes.find_or_insert(ops({1, 2}), 3), 1);  // recv0 -> attn0
  EXPECT_EQ(shapes.find_or_insert(ops({2, 3}), 4), 4);  // attn0, recv1: no edge inside
  EXPECT_EQ(shapes.find_or_insert(ops({4, 5}), 5), 4);  // attn1, recv2: the same
  EXPECT_EQ(shapes.find_or_insert(ops({2, 4}), 6), 6);  // attn0 -> attn1: an edge inside
  EXPECT_EQ(shapes.find_or_insert(ops({2, 6}), 7), 7);  // attn0, attn2: none
  EXPECT_EQ(shapes.find_or_insert(ops({0, 1}), 8), 8);  // ag, recv0: other classes
}

// Graphs of few op kinds with random edges, times and rates by kind.
struct Kinds {
  std::vector<StreamClass> stream;
  std::vector<double> solo_us;
};

StrandGraph draw_graph(std::mt19937_64& rng, const std::string& prefix, int n, const Kinds& kinds,
                       double edge_probability) {
  std::uniform_real_distribution<double> unit(0, 1);
  std::uniform_int_distribution<size_t> kind(0, kinds.stream.size() - 1);
  StrandGraph g;
  for (int i = 0; i < n; ++i) {
    std::vector<int64_t> preds;
    for (int p = 0; p < i; ++p) {
      if (unit(rng) < edge_probability) preds.push_back(p);
    }
    const size_t k = kind(rng);
    g.add_op(prefix + std::to_string(i), kinds.stream[k], kinds.solo_us[k], preds,
             prefix + "k" + std::to_string(k));
  }
  return g;
}

std::vector<OpMask> differences(const StrandGraph& g) {
  const std::vector<OpMask> downsets = enumerate_downsets(g, 1 << 16);
  std::vector<OpMask> out;
  for (OpMask small : downsets) {
    for (OpMask large : downsets) {
      if ((small & ~large) == 0) out.push_back(large & ~small);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

TEST(PieceShapes, PiecesOfOneShapeCostTheSameBesideEveryPartner) {
  std::mt19937_64 rng(20261125);
  std::uniform_real_distribution<double> unit(0, 1);
  int64_t shared = 0, compared = 0;
  for (int c = 0; c < 40; ++c) {
    Kinds kinds;
    for (int k = 0; k < 3; ++k) {
      const double u = unit(rng);
      kinds.stream.push_back(u < 0.5    ? StreamClass::kCompute
                             : u < 0.75 ? StreamClass::kLocalComm
                                        : StreamClass::kCrossComm);
      kinds.solo_us.push_back(unit(rng) < 0.1 ? 0.0 : 1 + std::floor(unit(rng) * 20));
    }
    const double density = 0.2 + 0.4 * unit(rng);
    const StrandGraph f = draw_graph(rng, "f", 8, kinds, density);
    const StrandGraph b = draw_graph(rng, "b", 7, kinds, density);
    TableCoRunModel rates;  // by kind, so that ops of one kind co-run alike
    for (int x = 0; x < 3; ++x) {
      for (int y = 0; y < 3; ++y) {
        for (const char* sx : {"f", "b"}) {
          for (const char* sy : {"f", "b"}) {
            rates.set_rate(std::string(sx) + "k" + std::to_string(x),
                           std::string(sy) + "k" + std::to_string(y), 0.6 + 0.4 * unit(rng));
          }
        }
      }
    }
    const BlockCostModel model(f, b, rates);
    for (const Strand strand : {Strand::kForward, Strand::kBackward}) {
      const bool forward = strand == Strand::kForward;
      const std::vector<OpMask> pieces = differences(forward ? f : b);
      const std::vector<OpMask> partners = differences(forward ? b : f);
      PieceShapes shapes(model, strand);
      std::map<int32_t, OpMask> first_of_shape;
      for (size_t k = 0; k < pieces.size(); ++k) {
        const int32_t id = shapes.find_or_insert(pieces[k], static_cast<int32_t>(k));
        if (id == static_cast<int32_t>(k)) {
          first_of_shape[id] = pieces[k];
          continue;
        }
        ++shared;
        const OpMask twin = first_of_shape.at(id);
        for (OpMask partner : partners) {
          const double a =
              forward ? model.cost_us(pieces[k], partner) : model.cost_us(partner, pieces[k]);
          const double t = forward ? model.cost_us(twin, partner) : model.cost_us(partner, twin);
          ASSERT_EQ(a, t) << "case " << c << " piece " << pieces[k] << " twin " << twin
                          << " partner " << partner;
          ++compared;
        }
      }
    }
  }
  // The draw must share shapes often, or the test proves nothing.
  EXPECT_GT(shared, 500);
  EXPECT_GT(compared, 20000);
}

}  // namespace
}  // namespace dhelix
