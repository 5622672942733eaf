// The pairing search at scale: strands too wide for the exact search are refused with a
// clear message before their storage is allocated, and the layer shift symmetry of a
// window (segment_cost.h, LayerPeriods) is used only where it holds and changes no cost.
#include <gtest/gtest.h>

#include <string>

#include "lib/error.h"
#include "planner/co_run_model.h"
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

std::string refusal(const StrandGraph& f, const StrandGraph& b) {
  const NoSlowdownModel none;
  try {
    search_pairing(BlockCostModel(f, b, none));
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
  const NoSlowdownModel none;
  const StrandGraph f = independent_ops("f", 12), b = chain("b", 2);
  const BlockCostModel model(f, b, none);
  EXPECT_THROW(search_pairing(model, options), Error);  // 3^12 = 531441 moves
  options.max_segment_ops = 2;                          // 4096 downsets x (1 + up to 12 + 66) moves
  const PairingResult r = search_pairing(model, options);
  EXPECT_LE(r.total_time_us, r.sequential_time_us);
  EXPECT_NEAR(resimulate_total_us(model, r.blocks), r.total_time_us, 1e-9);
}

// Slow-downs by stream pair: identical for every copy of a layer.
class StreamRates final : public CoRunModel {
 public:
  double rate(const StrandOp& a, const StrandOp& b) const override {
    return a.stream == b.stream ? 0.95 : 0.8 + 0.05 * static_cast<int>(b.stream);
  }
};

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
