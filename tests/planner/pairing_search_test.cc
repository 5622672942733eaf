// Pairing search on hand-built strands whose optimum is known. Times in us.
#include "planner/pairing_search.h"

#include <gtest/gtest.h>

#include "lib/error.h"

#include "planner/brute_force_pairing.h"
#include "planner/chunk_pairing.h"
#include "planner/co_run_model.h"
#include "planner/strand_graph.h"

namespace dhelix {
namespace {

constexpr StreamClass kC = StreamClass::kCompute;
constexpr StreamClass kL = StreamClass::kLocalComm;

// Absolute start of one op in a plan.
double start_in_plan(const PairingResult& r, Strand strand, int64_t op) {
  for (const PairingBlock& block : r.blocks) {
    for (const OpTiming& t : block.simulation.ops) {
      if (t.strand == strand && t.op == op) return block.start_us + t.start_us;
    }
  }
  ADD_FAILURE() << "op not in plan";
  return -1;
}

TEST(Downsets, DiamondHasSix) {
  StrandGraph g;
  g.add_op("a", kC, 1, {});
  g.add_op("b", kC, 1, {0});
  g.add_op("c", kL, 1, {0});
  g.add_op("d", kC, 1, {1, 2});
  // {}, {a}, {a,b}, {a,c}, {a,b,c}, {a,b,c,d}: by size, then mask value.
  EXPECT_EQ(enumerate_downsets(g, 100), (std::vector<OpMask>{0, 1, 3, 5, 7, 15}));
  EXPECT_TRUE(g.is_downset(5));
  EXPECT_FALSE(g.is_downset(6));
  EXPECT_EQ(count_topological_orders(g), 2);
}

TEST(Downsets, TooManyIsAnError) {
  StrandGraph g;
  for (int i = 0; i < 12; ++i) g.add_op("op" + std::to_string(i), kC, 1, {});
  EXPECT_EQ(enumerate_downsets(g, 4096).size(), 4096u);
  try {
    enumerate_downsets(g, 4095);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "exact pairing search refused: a strand of 12 ops has more than 4095 downsets "
                 "(too many ops with no order between them; n independent ops have 2^n "
                 "downsets)");
  }
}

// Every op of zero time (a profile of zeros, or ops too small to time): the sequential
// plan's 0 us seeds the branch and bound, and a block that only ties it must still be
// simulated to the end. The search once gave every block up (cost 0 >= give-up 0) and
// aborted on "pairing search reached no complete plan".
TEST(PairingSearch, ZeroTimesReachAPlan) {
  for (const double time_us : {0.0, 1e-300}) {
    StrandGraph f, b;
    f.add_op("f0", kL, time_us, {});
    f.add_op("f1", kC, time_us, {0});
    f.add_op("f2", kC, time_us, {1});
    b.add_op("b0", kC, time_us, {});
    b.add_op("b1", kL, time_us, {0});
    b.add_op("b2", kC, time_us, {0});
    const NoSlowdownModel none;
    const BlockCostModel model(f, b, none);
    for (const bool prune : {true, false}) {
      PairingOptions options;
      options.prune = prune;
      const PairingResult r = search_pairing(model, options);
      EXPECT_LE(r.total_time_us, 6 * time_us);
      OpMask fo = 0, bo = 0;
      for (const PairingBlock& block : r.blocks) {
        fo |= block.forward_ops;
        bo |= block.backward_ops;
      }
      EXPECT_EQ(fo, OpMask{7});
      EXPECT_EQ(bo, OpMask{7});
    }
  }
}

TEST(PairingSearch, CommPairsWithCompute) {
  // F = f0 (comm 10) -> f1 (compute 10); B = b0 (compute 10) -> b1 (comm 10). Alone each
  // strand takes 20, so 40 one after the other; co-run, f0 hides beside b0 and b1 beside
  // f1: 20, which is also the compute stream's total work, hence optimal.
  StrandGraph f, b;
  f.add_op("f0", kL, 10, {});
  f.add_op("f1", kC, 10, {0});
  b.add_op("b0", kC, 10, {});
  b.add_op("b1", kL, 10, {0});
  const NoSlowdownModel none;
  const BlockCostModel model(f, b, none);
  const PairingResult r = search_pairing(model);
  EXPECT_EQ(r.total_time_us, 20);
  EXPECT_EQ(r.sequential_time_us, 40);
  EXPECT_EQ(r.forward_alone_us, 20);
  EXPECT_EQ(r.backward_alone_us, 20);
  EXPECT_EQ(resimulate_total_us(model, r.blocks), 20);
  EXPECT_EQ(r.stats.states, 9);
  // Every op appears in exactly one block.
  OpMask fo = 0, bo = 0;
  for (const PairingBlock& block : r.blocks) {
    EXPECT_EQ(fo & block.forward_ops, 0u);
    EXPECT_EQ(bo & block.backward_ops, 0u);
    fo |= block.forward_ops;
    bo |= block.backward_ops;
  }
  EXPECT_EQ(fo, 3u);
  EXPECT_EQ(bo, 3u);
}

TEST(PairingSearch, ChainAgainstChain) {
  // F: f0 (c 10) -> f1 (l 20) -> f2 (c 10); B: b0 (c 20) -> b1 (l 10). Alone: 40 and 30.
  // Together: compute holds 40 us of work and F's path is 40, so 40 is a lower bound;
  // f0 0-10, f1 10-30 beside b0 10-30, f2 30-40 beside b1 30-40 reaches it.
  StrandGraph f, b;
  f.add_op("f0", kC, 10, {});
  f.add_op("f1", kL, 20, {0});
  f.add_op("f2", kC, 10, {1});
  b.add_op("b0", kC, 20, {});
  b.add_op("b1", kL, 10, {0});
  const NoSlowdownModel none;
  const PairingResult r = search_pairing(BlockCostModel(f, b, none));
  EXPECT_EQ(r.total_time_us, 40);
  EXPECT_EQ(r.sequential_time_us, 70);
}

TEST(PairingSearch, ComputeOnlyChainsCannotOverlap) {
  StrandGraph f, b;
  f.add_op("f0", kC, 10, {});
  f.add_op("f1", kC, 15, {0});
  b.add_op("b0", kC, 20, {});
  b.add_op("b1", kC, 5, {0});
  const NoSlowdownModel none;
  const PairingResult r = search_pairing(BlockCostModel(f, b, none));
  EXPECT_EQ(r.total_time_us, 50);
  EXPECT_EQ(r.sequential_time_us, 50);
}

TEST(PairingSearch, WgradSinkMovesToHideComm) {
  // F: f0 (all-gather, l 30) -> f1 (c 10). B: b0 (dgrad, c 10) -> b1 (reduce-scatter,
  // l 30), and the wgrad w (c 30) after b0, a sink. Alone: F 40, B 40 (w beside b1).
  // Together the local stream holds 60 us, so >= 60; reaching 60 needs f0 at 0-30 and b1
  // at 30-60, hence w must run beside f0 (10-40), before b1 although it is the last op
  // of B's natural order.
  StrandGraph f, b;
  f.add_op("f0", kL, 30, {});
  f.add_op("f1", kC, 10, {0});
  b.add_op("b0", kC, 10, {});
  b.add_op("b1", kL, 30, {0});
  b.add_op("w", kC, 30, {0});
  const NoSlowdownModel none;
  const PairingResult r = search_pairing(BlockCostModel(f, b, none));
  EXPECT_EQ(r.total_time_us, 60);
  EXPECT_EQ(r.sequential_time_us, 80);
  EXPECT_LT(start_in_plan(r, Strand::kBackward, 2), 30);  // w overlaps f0
  EXPECT_EQ(start_in_plan(r, Strand::kBackward, 1), 30);
}

TEST(PairingSearch, SlowdownMakesABarrierWorthIt) {
  // F: f0 (c 100) and f1 (l 100), independent. B: b0 (c 100). With rates 0.5 both ways
  // between f0 and f1 and no other slowdown, running f0 beside f1 takes 100 / 0.5 = 200,
  // no better than 100 + 100. The optimum pairs f1 with b0 (100) and leaves f0 alone
  // (100): 200, versus 300 when f0 and b0 are also in one block with f1 in parallel.
  StrandGraph f, b;
  f.add_op("f0", kC, 100, {});
  f.add_op("f1", kL, 100, {});
  b.add_op("b0", kC, 100, {});
  TableCoRunModel rates;
  rates.set_pair("f0", "f1", 0.5, 0.5);
  const BlockCostModel model(f, b, rates);
  const PairingResult r = search_pairing(model);
  EXPECT_NEAR(r.total_time_us, 200, 1e-9);
  EXPECT_NEAR(r.forward_alone_us, 200, 1e-9);  // alone: f0 then f1, or both at half speed
  EXPECT_NEAR(r.sequential_time_us, 300, 1e-9);
  EXPECT_NEAR(brute_force_pairing(model).total_time_us, 200, 1e-9);
}

TEST(PairingSearch, MaxSegmentOpsIsRespected) {
  // F: two independent ops (c 10, l 10), B empty. One block overlaps them (10); with at
  // most one op per segment they run one after the other (20).
  StrandGraph f, b;
  f.add_op("f0", kC, 10, {});
  f.add_op("f1", kL, 10, {});
  const NoSlowdownModel none;
  const BlockCostModel model(f, b, none);
  EXPECT_EQ(search_pairing(model).total_time_us, 10);
  PairingOptions one;
  one.max_segment_ops = 1;
  const PairingResult r = search_pairing(model, one);
  EXPECT_EQ(r.total_time_us, 20);
  for (const PairingBlock& block : r.blocks) EXPECT_LE(mask_size(block.forward_ops), 1);
}

TEST(PairingSearch, MaxSegmentOpsOnBothSides) {
  StrandGraph f, b;
  f.add_op("f0", kL, 10, {});
  f.add_op("f1", kC, 10, {0});
  f.add_op("f2", kL, 10, {1});
  b.add_op("b0", kC, 10, {});
  b.add_op("b1", kL, 10, {0});
  b.add_op("b2", kC, 10, {1});
  const NoSlowdownModel none;
  const BlockCostModel model(f, b, none);
  for (int64_t bound = 1; bound <= 3; ++bound) {
    PairingOptions options;
    options.max_segment_ops = bound;
    const PairingResult r = search_pairing(model, options);
    // Pairs (f0,b0), (f1,b1), (f2,b2) each take 10: 30 whatever the bound.
    EXPECT_EQ(r.total_time_us, 30) << bound;
    EXPECT_EQ(r.total_time_us, brute_force_pairing(model, bound).total_time_us) << bound;
    for (const PairingBlock& block : r.blocks) {
      EXPECT_LE(mask_size(block.forward_ops), bound);
      EXPECT_LE(mask_size(block.backward_ops), bound);
    }
  }
}

TEST(PairingSearch, PruningChangesNothingButTheWork) {
  StrandGraph f, b;
  f.add_op("f0", kL, 30, {});
  f.add_op("f1", kC, 10, {0});
  f.add_op("f2", kL, 15, {1});
  b.add_op("b0", kC, 10, {});
  b.add_op("b1", kL, 30, {0});
  b.add_op("w", kC, 30, {0});
  const NoSlowdownModel none;
  const BlockCostModel model(f, b, none);
  PairingOptions plain;
  plain.prune = false;
  const PairingResult pruned = search_pairing(model);
  const PairingResult full = search_pairing(model, plain);
  EXPECT_EQ(pruned.total_time_us, full.total_time_us);
  EXPECT_EQ(full.stats.transitions_pruned, 0);
  EXPECT_GT(pruned.stats.transitions_pruned, 0);
  EXPECT_LT(pruned.stats.block_simulations, full.stats.block_simulations);
}

TEST(PairingSearch, EmptyBackwardStrandIsTheForwardAlone) {
  StrandGraph f, b;
  f.add_op("f0", kC, 10, {});
  f.add_op("f1", kL, 5, {0});
  const NoSlowdownModel none;
  const PairingResult r = search_pairing(BlockCostModel(f, b, none));
  EXPECT_EQ(r.total_time_us, 15);
  EXPECT_EQ(r.sequential_time_us, 15);
  EXPECT_EQ(r.backward_alone_us, 0);
}

TEST(StrandGraph, ConcatenatedLayersKeepSinksInTheirLayer) {
  StrandGraph layer;
  layer.add_op("dgrad", kC, 10, {});
  layer.add_op("wgrad", kC, 10, {0});
  layer.add_op("rs", kL, 5, {0});
  const StrandGraph two = concatenate_layers({layer, layer});
  ASSERT_EQ(two.size(), 6);
  EXPECT_EQ(two.op(3).id, "L1.dgrad");
  EXPECT_EQ(two.op(3).cost_key, "dgrad");
  EXPECT_EQ(two.op(3).predecessors, (std::vector<int64_t>{1, 2}));  // both sinks of L0
  EXPECT_EQ(two.op(4).predecessors, (std::vector<int64_t>{3}));
  // Downsets: 4 in layer 0 ({}, {d}, {d,w}, {d,r}, full: 5 with full) + 4 more in layer 1.
  EXPECT_EQ(enumerate_downsets(two, 100).size(), 9u);
}

}  // namespace
}  // namespace dhelix

namespace dhelix {
namespace {

// One layer: F = f0 (c 10) -> f1 (l 10), B = b0 (c 10) -> b1 (l 10). Alone 20 + 20. Paired,
// the compute stream holds 20 and a comm op must follow the last compute op: >= 30, which
// b0 0-10 | f0 10-20 beside b1 | f1 20-30 reaches. Across two layers (c l c l each) the
// compute stream can run back to back while comm trails: 40 + 10 = 50 < 2 x 30.
TEST(ChunkPairing, CrossLayerScopeWinsWhenLayersInterlock) {
  StrandGraph f, b;
  f.add_op("f0", StreamClass::kCompute, 10, {});
  f.add_op("f1", StreamClass::kLocalComm, 10, {0});
  b.add_op("b0", StreamClass::kCompute, 10, {});
  b.add_op("b1", StreamClass::kLocalComm, 10, {0});
  const NoSlowdownModel none;
  ChunkPairingOptions options;
  options.num_layers = 2;
  const ChunkPairingResult two = search_chunk_pairing(f, b, none, options);
  EXPECT_EQ(two.per_layer.total_time_us, 30);
  EXPECT_EQ(two.per_layer_chunk_us, 60);
  EXPECT_EQ(two.sequential_chunk_us, 80);
  EXPECT_EQ(two.window_layers, 2);
  EXPECT_EQ(two.cross_window.total_time_us, 50);
  EXPECT_EQ(two.cross_layer_chunk_us, 50);
  EXPECT_TRUE(two.cross_layer_better);
  EXPECT_EQ(two.best_chunk_us, 50);
  // Three layers in windows of at most two: one window of two (50) + one layer (30).
  options.num_layers = 3;
  options.max_window_layers = 2;
  const ChunkPairingResult three = search_chunk_pairing(f, b, none, options);
  EXPECT_EQ(three.cross_remainder.total_time_us, 30);
  EXPECT_EQ(three.cross_layer_chunk_us, 80);
  EXPECT_EQ(three.per_layer_chunk_us, 90);
  EXPECT_EQ(three.best_chunk_us, 80);
}

TEST(ChunkPairing, SingleLayerChunkHasNoCrossLayerSearch) {
  StrandGraph f, b;
  f.add_op("f0", StreamClass::kCompute, 10, {});
  b.add_op("b0", StreamClass::kLocalComm, 10, {});
  const NoSlowdownModel none;
  const ChunkPairingResult r = search_chunk_pairing(f, b, none, ChunkPairingOptions{});
  EXPECT_EQ(r.window_layers, 1);
  EXPECT_FALSE(r.cross_layer_better);
  EXPECT_EQ(r.best_chunk_us, 10);
}

}  // namespace
}  // namespace dhelix
