#include "planner/folding.h"

#include <gtest/gtest.h>

#include <vector>

#include "lib/error.h"

namespace dhelix {
namespace {

std::string error_of(int64_t layers, int64_t pp, bool folded) {
  try {
    if (folded) {
      fold_layers(layers, pp);
    } else {
      unfold_layers(layers, pp);
    }
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidInput);
    return e.what();
  }
  return "no error";
}

// Paper Figure 7: 32 layers on 4 GPUs, G0 holds L0-L3 and L28-L31.
TEST(Folding, MatchesPaperFigure7) {
  const FoldedLayout layout = fold_layers(32, 4);
  EXPECT_EQ(layout.layers_per_chunk, 4);
  EXPECT_EQ(layout.layers_per_stage(), 8);
  ASSERT_EQ(layout.stages.size(), 4u);
  const int64_t expected[4][2] = {{0, 28}, {4, 24}, {8, 20}, {12, 16}};
  for (int64_t p = 0; p < 4; ++p) {
    EXPECT_EQ(layout.stages[p].down.first, expected[p][0]) << p;
    EXPECT_EQ(layout.stages[p].down.count, 4) << p;
    EXPECT_EQ(layout.stages[p].up.first, expected[p][1]) << p;
    EXPECT_EQ(layout.stages[p].up.last(), expected[p][1] + 3) << p;
  }
  EXPECT_EQ(layout.embedding_stage, 0);
  EXPECT_EQ(layout.head_loss_stage, 0);
  EXPECT_EQ(layout.stage_of_layer(31), 0);
  EXPECT_EQ(layout.chunk_of_layer(31), ChunkSide::kUp);
  EXPECT_EQ(layout.stage_of_layer(16), 3);
  EXPECT_EQ(layout.chunk_of_layer(15), ChunkSide::kDown);
}

// The prototype's rule: stage p holds p·c+k and its mirror N-1-(p·c+k).
TEST(Folding, EveryLayerOnceAndMirrorsPaired) {
  for (int64_t pp = 1; pp <= 6; ++pp) {
    const int64_t layers = 2 * pp * 3;
    const FoldedLayout layout = fold_layers(layers, pp);
    std::vector<int> seen(static_cast<size_t>(layers), 0);
    for (int64_t p = 0; p < pp; ++p) {
      const FoldedStage& s = layout.stages[p];
      for (int64_t k = 0; k < layout.layers_per_chunk; ++k) {
        const int64_t layer = p * layout.layers_per_chunk + k;
        EXPECT_TRUE(s.down.contains(layer));
        EXPECT_TRUE(s.up.contains(layers - 1 - layer));
        seen[static_cast<size_t>(layer)] += 1;
        seen[static_cast<size_t>(layers - 1 - layer)] += 1;
        EXPECT_EQ(layout.stage_of_layer(layer), p);
        EXPECT_EQ(layout.stage_of_layer(layers - 1 - layer), p);
      }
    }
    for (int count : seen) EXPECT_EQ(count, 1);
  }
}

TEST(Folding, UnfoldedLayoutPutsHeadOnLastStage) {
  const UnfoldedLayout layout = unfold_layers(32, 4);
  EXPECT_EQ(layout.layers_per_stage, 8);
  EXPECT_EQ(layout.stages[3].first, 24);
  EXPECT_EQ(layout.stages[3].last(), 31);
  EXPECT_EQ(layout.embedding_stage, 0);
  EXPECT_EQ(layout.head_loss_stage, 3);
  EXPECT_EQ(layout.stage_of_layer(23), 2);
}

TEST(Folding, IndivisibleLayerCountNamesTheFix) {
  EXPECT_EQ(error_of(30, 4, true),
            "pp = 4: num_layers = 30 is not divisible by 2·pp = 8; model folding gives every "
            "stage two chunks of equal size: use num_layers = 24 or 32, or a pp dividing "
            "num_layers / 2 = 15 (1, 3, 5, 15)");
  EXPECT_EQ(error_of(31, 2, true),
            "pp = 2: num_layers = 31 is not divisible by 2·pp = 4; model folding gives every "
            "stage two chunks of equal size: use num_layers = 28 or 32 (an odd layer count "
            "cannot be folded for any pp)");
  EXPECT_EQ(error_of(6, 4, true),
            "pp = 4: num_layers = 6 is not divisible by 2·pp = 8; model folding gives every "
            "stage two chunks of equal size: use num_layers = 8, or a pp dividing "
            "num_layers / 2 = 3 (1, 3)");
  EXPECT_EQ(error_of(30, 4, false),
            "pp = 4: num_layers = 30 is not divisible by pp; every stage keeps the same number "
            "of layers: use num_layers = 28 or 32, or a pp dividing 30 (1, 2, 3, 5, 6, 10, 15, "
            "30)");
  EXPECT_EQ(error_of(8, 0, true), "pp = 0: the number of pipeline stages must be at least 1");
  EXPECT_EQ(error_of(0, 2, false), "num_layers = 0: a model needs at least one layer");
}

}  // namespace
}  // namespace dhelix
