// The pairing search at scale: strands too wide for the exact search are refused with a
// clear message before their storage is allocated, and the layer shift symmetry of a
// window (segment_cost.h, LayerPeriods) is used only where it holds and changes no cost.
#include <gtest/gtest.h>

#include <string>

#include "lib/error.h"
#include "planner/co_run_model.h"
#include "planner/downset_lattice.h"
#include "planner/pairing_search.h"
#include "planner/strand_graph.h"

namespace dhelix {
namespace {

StrandGraph independent_ops(const std::string& prefix, int n) {
  StrandGraph g;
  for (int i = 0; i < n; ++i) {
    g.add_op(prefix + std::to_string(i),
             i % 2 == 0 ? StreamClass::kCompute : StreamClass::kLocalComm, 10 + i, {});
  }
  return g;
}

StrandGraph chain(const std::string& prefix, int n) {
  StrandGraph g;
  for (int i = 0; i < n; ++i) {
    g.add_op(prefix + std::to_string(i), StreamClass::kCompute, 10,
             i == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{i - 1});
  }
  return g;
}

// Without the work budget, which would bound the segments instead (the test below).
std::string refusal(const StrandGraph& f, const StrandGraph& b) {
  const NoSlowdownModel none;
  PairingOptions options;
  options.max_block_pairs = 0;
  try {
    search_pairing(BlockCostModel(f, b, none), options);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    return e.what();
  }
  return "not refused";
}

// 16 independent ops: 65536 downsets (within the limit) but 3^16 = 43 million moves, which
// would take gigabytes: refused while counting, before any step is stored.
TEST(PairingScale, SixteenIndependentOpsAreRefusedByTheirMoves) {
  EXPECT_EQ(refusal(independent_ops("f", 16), chain("b", 3)),
            "exact pairing search refused: the fwd strand (16 ops, 65536 downsets) has more than "
            "4194304 moves from a downset to a superset (too many ops with no order between "
            "them; a segment bound, PairingOptions::max_segment_ops, reduces them)");
}

// On both sides: 65536 x 65536 states, refused before any step is counted.
TEST(PairingScale, SixteenIndependentOpsOnBothSidesAreRefusedByTheirStates) {
  EXPECT_EQ(refusal(independent_ops("f", 16), independent_ops("b", 16)),
            "exact pairing search refused: it needs 65536 x 65536 states (forward x backward "
            "downsets), more than the limit of 67108864 (too many ops with no order between "
            "them)");
}

// 24 independent ops: 16.7 million downsets, refused at the downset limit.
TEST(PairingScale, TwentyFourIndependentOpsAreRefusedByTheirDownsets) {
  EXPECT_EQ(refusal(chain("f", 3), independent_ops("b", 24)),
            "exact pairing search refused: a strand of 24 ops has more than 1048576 downsets "
            "(too many ops with no order between them; n independent ops have 2^n downsets)");
}

// A segment bound keeps a wide strand searchable: 12 independent ops, segments of 2.
TEST(PairingScale, SegmentBoundMakesAWideStrandSearchable) {
  PairingOptions options;
  options.max_steps = 100000;
  options.max_block_pairs = 0;
  const NoSlowdownModel none;
  const StrandGraph f = independent_ops("f", 12), b = chain("b", 2);
  const BlockCostModel model(f, b, none);
  EXPECT_THROW(search_pairing(model, options), Error);  // 3^12 = 531441 moves
  options.max_segment_ops = 2;                          // 4096 downsets x (1 + up to 12 + 66) moves
  const PairingResult r = search_pairing(model, options);
  EXPECT_LE(r.total_time_us, r.sequential_time_us);
  EXPECT_NEAR(resimulate_total_us(model, r.blocks), r.total_time_us, 1e-9);
}

// Three independent 10 us ops, one per stream, against a chain of 3: 27 x 10 = 270 block
// pairs, 26 x 9 = 234 with 2-op segments, 20 x 7 = 140 with 1. A budget of 200 bounds the
// segments to 1 op, where the forward alone would take 30 us; the strands alone are
// searched again without the bound: 10 us, all three streams at once.
TEST(PairingScale, TheStrandsAloneIgnoreTheBudget) {
  StrandGraph f;
  f.add_op("c", StreamClass::kCompute, 10, {});
  f.add_op("l", StreamClass::kLocalComm, 10, {});
  f.add_op("x", StreamClass::kCrossComm, 10, {});
  const StrandGraph b = chain("b", 3);
  const NoSlowdownModel none;
  const BlockCostModel model(f, b, none);
  PairingOptions budget;
  budget.max_block_pairs = 200;
  const PairingResult r = search_pairing(model, budget);
  EXPECT_EQ(r.segment_bound, 1);
  EXPECT_EQ(r.forward_alone_us, 10);
  EXPECT_EQ(r.backward_alone_us, 30);
  EXPECT_EQ(r.sequential_time_us, 40);
  EXPECT_EQ(r.forward_alone_blocks.size(), 1u);
}

// Slow-downs by stream pair: identical for every copy of a layer.
class StreamRates final : public CoRunModel {
 public:
  double rate(const StrandOp& a, const StrandOp& b) const override {
    return a.stream == b.stream ? 0.95 : 0.8 + 0.05 * static_cast<int>(b.stream);
  }
};

// Moves counted against closed forms: n independent ops have 3^n (each op before the
// move, in it, or after it), sum over j <= k of C(n, j) 2^(n - j) with at most k ops moved;
// a chain of 3 has 4 + 3 + 2 + 1 = 10, 9 with at most 2 ops moved.
TEST(PairingScale, MovesAreCountedAsTheClosedFormsSay) {
  const NoSlowdownModel none;
  const StrandGraph f = independent_ops("f", 8), b = chain("b", 3);
  const BlockCostModel model(f, b, none);
  const Lattice lf = lattice_downsets(model, Strand::kForward, PairingOptions{});
  const Lattice lb = lattice_downsets(model, Strand::kBackward, PairingOptions{});
  EXPECT_EQ(count_lattice_steps(model, lf, 0, 1 << 20), 6561);  // 3^8
  EXPECT_EQ(count_lattice_steps(model, lf, 2, 1 << 20), 256 + 8 * 128 + 28 * 64);
  EXPECT_EQ(count_lattice_steps(model, lf, 0, 100), 101);  // past the cap
  EXPECT_EQ(count_lattice_steps(model, lb, 0, 1 << 20), 10);
  EXPECT_EQ(count_lattice_steps(model, lb, 2, 1 << 20), 9);
}

// The work budget (pairing_search.h, 5.): 8 independent forward ops against a chain of 3
// weigh 6561 x 10 = 65610 block pairs; with a budget of 35000 the widest segments that fit
// are 2 ops (3072 x 9 = 27648; 3 ops: 4864 x 10 = 48640), and the result is the exact
// search within that bound.
TEST(PairingScale, TheWorkBudgetBoundsTheSegments) {
  const StreamRates rates;
  const StrandGraph f = independent_ops("f", 8), b = chain("b", 3);
  const BlockCostModel model(f, b, rates);
  PairingOptions budget;
  budget.max_block_pairs = 35000;
  const PairingResult bounded = search_pairing(model, budget);
  EXPECT_EQ(bounded.segment_bound, 2);
  PairingOptions two;
  two.max_segment_ops = 2;
  two.max_block_pairs = 0;
  const PairingResult exact_within = search_pairing(model, two);
  EXPECT_EQ(bounded.total_time_us, exact_within.total_time_us);
  ASSERT_EQ(bounded.blocks.size(), exact_within.blocks.size());
  for (size_t k = 0; k < bounded.blocks.size(); ++k) {
    EXPECT_LE(mask_size(bounded.blocks[k].forward_ops), 2);
    EXPECT_LE(mask_size(bounded.blocks[k].backward_ops), 2);
  }
  // The default budget leaves this search unbounded, and an unbounded search is no worse.
  const PairingResult unbounded = search_pairing(model);
  EXPECT_EQ(unbounded.segment_bound, 0);
  EXPECT_LE(unbounded.total_time_us, bounded.total_time_us);
  // The strands alone (Megatron-LM's layer times) do not depend on the budget.
  EXPECT_EQ(bounded.forward_alone_us, unbounded.forward_alone_us);
  EXPECT_EQ(bounded.backward_alone_us, unbounded.backward_alone_us);
  EXPECT_EQ(bounded.sequential_time_us, unbounded.sequential_time_us);
  // A budget that already fits keeps the segment bound asked for.
  PairingOptions asked;
  asked.max_segment_ops = 3;
  asked.max_block_pairs = 60000;
  EXPECT_EQ(search_pairing(model, asked).segment_bound, 3);
}

StrandGraph layer(const std::string& prefix, double scale) {
  StrandGraph g;
  g.add_op(prefix + "gemm", StreamClass::kCompute, 30 * scale, {});
  g.add_op(prefix + "ag", StreamClass::kLocalComm, 12 * scale, {0});
  g.add_op(prefix + "attn", StreamClass::kCompute, 25 * scale, {1});
  g.add_op(prefix + "wgrad", StreamClass::kCompute, 20 * scale, {0});
  g.add_op(prefix + "rs", StreamClass::kCrossComm, 15 * scale, {2});
  return g;
}

TEST(PairingScale, LayerShiftSymmetryHoldsOnlyForRepeatedLayers) {
  const StreamRates rates;
  const StrandGraph f = concatenate_layers({layer("f", 1), layer("f", 1), layer("f", 1)});
  const StrandGraph b = concatenate_layers({layer("b", 2), layer("b", 2), layer("b", 2)});
  const BlockCostModel plain(f, b, rates);
  const BlockCostModel symmetric(f, b, rates, LayerPeriods{5, 5});
  // Layer 2's gemm + ag shifted to layer 0; without symmetry nothing moves.
  EXPECT_EQ(symmetric.canonical(Strand::kForward, OpMask{3} << 10), OpMask{3});
  EXPECT_EQ(symmetric.canonical(Strand::kBackward, OpMask{0x3C} << 5), OpMask{0x3C});
  EXPECT_EQ(plain.canonical(Strand::kForward, OpMask{3} << 10), OpMask{3} << 10);
  // Shifted blocks cost exactly the same, also when the two sides shift differently.
  EXPECT_EQ(plain.cost_us(OpMask{0x1E} << 5, OpMask{0x3F} << 3), plain.cost_us(0x1E, 0x3F << 3));
  EXPECT_EQ(plain.cost_us(OpMask{0x1E} << 10, 0x7), plain.cost_us(0x1E, 0x7));
  // A period that does not divide the strand, or layers that differ, disable it.
  EXPECT_EQ(BlockCostModel(f, b, rates, LayerPeriods{4, 5}).canonical(Strand::kForward, 0x30),
            0x30u);
  const StrandGraph uneven = concatenate_layers({layer("f", 1), layer("f", 1.5), layer("f", 1)});
  const BlockCostModel broken(uneven, b, rates, LayerPeriods{5, 5});
  EXPECT_EQ(broken.canonical(Strand::kForward, OpMask{3} << 10), OpMask{3} << 10);
  EXPECT_EQ(broken.canonical(Strand::kBackward, OpMask{3} << 10), OpMask{3} << 10);
}

TEST(PairingScale, SymmetricWindowSearchEqualsThePlainOne) {
  const StreamRates rates;
  const StrandGraph f = concatenate_layers({layer("f", 1), layer("f", 1), layer("f", 1)});
  const StrandGraph b = concatenate_layers({layer("b", 2), layer("b", 2), layer("b", 2)});
  for (int64_t bound : {0, 4}) {
    PairingOptions options;
    options.max_segment_ops = bound;
    const PairingResult plain = search_pairing(BlockCostModel(f, b, rates), options);
    const PairingResult fast =
        search_pairing(BlockCostModel(f, b, rates, LayerPeriods{5, 5}), options);
    EXPECT_EQ(fast.total_time_us, plain.total_time_us);
    EXPECT_EQ(fast.sequential_time_us, plain.sequential_time_us);
    ASSERT_EQ(fast.blocks.size(), plain.blocks.size());
    for (size_t k = 0; k < plain.blocks.size(); ++k) {
      EXPECT_EQ(fast.blocks[k].forward_ops, plain.blocks[k].forward_ops);
      EXPECT_EQ(fast.blocks[k].backward_ops, plain.blocks[k].backward_ops);
    }
    // Piece shapes (planner/piece_shapes.h) find the layer shift without being told, so
    // the plain search shares those simulations too; the periods only shift earlier.
    EXPECT_LE(fast.stats.block_simulations, plain.stats.block_simulations);
  }
}

}  // namespace
}  // namespace dhelix
