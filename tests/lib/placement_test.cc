#include "lib/placement.h"

#include <vector>

#include <gtest/gtest.h>

namespace dhelix {
namespace {

using Ranks = std::vector<int64_t>;

ParallelSpec shape(int64_t tp, int64_t cp, int64_t dp, int64_t pp, int64_t ep = 1) {
  ParallelSpec parallel;
  parallel.tp = tp;
  parallel.cp = cp;
  parallel.dp = dp;
  parallel.pp = pp;
  parallel.ep = ep;
  return parallel;
}

TEST(Placement, ScopeNames) {
  EXPECT_STREQ(group_scope_name(GroupScope::kLocal), "local");
  EXPECT_STREQ(group_scope_name(GroupScope::kCrossNode), "cross-node");
}

TEST(Placement, Tp8Dp8OnEightGpuNodes) {
  const Placement placement(shape(8, 1, 8, 1), 8);
  EXPECT_EQ(placement.world_size(), 64);
  const ProcessGroup tp = placement.group(ParallelDim::kTp, 13);
  EXPECT_EQ(tp.ranks, (Ranks{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(tp.scope, GroupScope::kLocal);
  EXPECT_EQ(tp.nodes_spanned, 1);
  const ProcessGroup dp = placement.group(ParallelDim::kDp, 13);
  EXPECT_EQ(dp.ranks, (Ranks{5, 13, 21, 29, 37, 45, 53, 61}));
  EXPECT_EQ(dp.scope, GroupScope::kCrossNode);
  EXPECT_EQ(dp.nodes_spanned, 8);
  for (const ProcessGroup& group : placement.all_groups(ParallelDim::kTp)) {
    EXPECT_EQ(group.scope, GroupScope::kLocal);
  }
  for (const ProcessGroup& group : placement.all_groups(ParallelDim::kDp)) {
    EXPECT_EQ(group.scope, GroupScope::kCrossNode);
  }
}

TEST(Placement, Tp2Cp2Dp2Pp2OnFourGpuNodes) {
  // rank = tp + 2·cp + 4·dp + 8·pp; nodes hold 0-3, 4-7, 8-11, 12-15.
  const Placement placement(shape(2, 2, 2, 2), 4);
  const RankCoordinates c = placement.coordinates(5);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.pp, 0);
  EXPECT_EQ(c.ep, 0);
  struct Case {
    int64_t rank;
    Ranks tp, cp, dp, pp;
  };
  const Case cases[] = {
      {5, {4, 5}, {5, 7}, {1, 5}, {5, 13}},
      {10, {10, 11}, {8, 10}, {10, 14}, {2, 10}},
      {15, {14, 15}, {13, 15}, {11, 15}, {7, 15}},
      {0, {0, 1}, {0, 2}, {0, 4}, {0, 8}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.rank);
    EXPECT_EQ(placement.group(ParallelDim::kTp, k.rank).ranks, k.tp);
    EXPECT_EQ(placement.group(ParallelDim::kCp, k.rank).ranks, k.cp);
    EXPECT_EQ(placement.group(ParallelDim::kDp, k.rank).ranks, k.dp);
    EXPECT_EQ(placement.group(ParallelDim::kPp, k.rank).ranks, k.pp);
    EXPECT_EQ(placement.group(ParallelDim::kEp, k.rank).ranks, Ranks{k.rank});  // ep = 1
    EXPECT_EQ(placement.group(ParallelDim::kTp, k.rank).scope, GroupScope::kLocal);
    EXPECT_EQ(placement.group(ParallelDim::kCp, k.rank).scope, GroupScope::kLocal);
    EXPECT_EQ(placement.group(ParallelDim::kDp, k.rank).scope, GroupScope::kCrossNode);
    EXPECT_EQ(placement.group(ParallelDim::kPp, k.rank).nodes_spanned, 2);
  }
  const std::vector<ProcessGroup> pp = placement.all_groups(ParallelDim::kPp);
  ASSERT_EQ(pp.size(), 8u);
  EXPECT_EQ(pp.front().ranks, (Ranks{0, 8}));
  EXPECT_EQ(pp.back().ranks, (Ranks{7, 15}));
}

TEST(Placement, HeaderExampleTp2Dp2Pp2) {
  const Placement placement(shape(2, 1, 2, 2), 4);
  std::vector<Ranks> tp, pp;
  for (const ProcessGroup& group : placement.all_groups(ParallelDim::kTp))
    tp.push_back(group.ranks);
  for (const ProcessGroup& group : placement.all_groups(ParallelDim::kPp))
    pp.push_back(group.ranks);
  EXPECT_EQ(tp, (std::vector<Ranks>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(pp, (std::vector<Ranks>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(Placement, Ep4WithinDp8) {
  // tp2 dp8 ep4: rank = tp + 2·dp; EP splits each TP lane's 8 DP replicas into runs of 4.
  const Placement placement(shape(2, 1, 8, 1, 4), 8);
  EXPECT_EQ(placement.world_size(), 16);
  EXPECT_EQ(placement.group(ParallelDim::kEp, 0).ranks, (Ranks{0, 2, 4, 6}));
  EXPECT_EQ(placement.group(ParallelDim::kEp, 9).ranks, (Ranks{9, 11, 13, 15}));
  EXPECT_EQ(placement.group(ParallelDim::kEp, 9).scope, GroupScope::kLocal);
  EXPECT_EQ(placement.coordinates(9).ep, 0);
  EXPECT_EQ(placement.coordinates(11).ep, 1);
  EXPECT_EQ(placement.coordinates(15).ep, 3);
  EXPECT_EQ(placement.all_groups(ParallelDim::kEp).size(), 4u);
  // The DP group still spans all eight replicas.
  EXPECT_EQ(placement.group(ParallelDim::kDp, 9).ranks, (Ranks{1, 3, 5, 7, 9, 11, 13, 15}));
}

TEST(Placement, EpCutsTheCpDpBlockCpFastest) {
  // cp2 dp4 ep4: block index = cp + 2·dp = rank; EP groups {0..3} {4..7}.
  const Placement placement(shape(1, 2, 4, 1, 4), 2);
  EXPECT_EQ(placement.group(ParallelDim::kEp, 5).ranks, (Ranks{4, 5, 6, 7}));
  EXPECT_EQ(placement.group(ParallelDim::kEp, 5).scope, GroupScope::kCrossNode);
  EXPECT_EQ(placement.group(ParallelDim::kEp, 5).nodes_spanned, 2);
  EXPECT_EQ(placement.coordinates(6).ep, 2);
}

TEST(Placement, Tp16SpansTwoEightGpuNodes) {
  const Placement placement(shape(16, 1, 1, 1), 8);
  const ProcessGroup tp = placement.group(ParallelDim::kTp, 3);
  EXPECT_EQ(tp.ranks.size(), 16u);
  EXPECT_EQ(tp.scope, GroupScope::kCrossNode);
  EXPECT_EQ(tp.nodes_spanned, 2);
  EXPECT_EQ(placement.node_of(15), 1);
}

TEST(Placement, CustomRankOrderPutsDpFastest) {
  ParallelSpec parallel = shape(2, 1, 4, 1);
  parallel.rank_order = {ParallelDim::kDp, ParallelDim::kTp, ParallelDim::kCp, ParallelDim::kPp};
  const Placement placement(parallel, 4);
  // rank = dp + 4·tp: DP is node-local, TP crosses nodes.
  EXPECT_EQ(placement.group(ParallelDim::kDp, 5).ranks, (Ranks{4, 5, 6, 7}));
  EXPECT_EQ(placement.group(ParallelDim::kTp, 5).ranks, (Ranks{1, 5}));
  EXPECT_EQ(placement.group(ParallelDim::kTp, 5).scope, GroupScope::kCrossNode);
}

TEST(Placement, RankOfInvertsCoordinates) {
  std::vector<ParallelSpec> shapes = {shape(8, 1, 8, 1), shape(2, 2, 2, 2), shape(2, 1, 8, 1, 4),
                                      shape(4, 2, 4, 2, 8), shape(1, 1, 1, 1)};
  ParallelSpec reordered = shape(2, 2, 3, 2);
  reordered.rank_order = {ParallelDim::kPp, ParallelDim::kDp, ParallelDim::kEp, ParallelDim::kCp,
                          ParallelDim::kTp};
  shapes.push_back(reordered);
  for (const ParallelSpec& parallel : shapes) {
    const Placement placement(parallel, 8);
    for (int64_t rank = 0; rank < placement.world_size(); ++rank) {
      ASSERT_EQ(placement.rank_of(placement.coordinates(rank)), rank);
    }
  }
}

TEST(Placement, EveryRankIsInExactlyOneGroupPerDimension) {
  const Placement placement(shape(2, 2, 4, 2, 4), 8);
  for (ParallelDim dim :
       {ParallelDim::kTp, ParallelDim::kCp, ParallelDim::kEp, ParallelDim::kDp, ParallelDim::kPp}) {
    std::vector<int> seen(static_cast<size_t>(placement.world_size()), 0);
    for (const ProcessGroup& group : placement.all_groups(dim)) {
      for (int64_t rank : group.ranks) ++seen[static_cast<size_t>(rank)];
    }
    EXPECT_EQ(seen, std::vector<int>(seen.size(), 1));
  }
}

}  // namespace
}  // namespace dhelix
