#include "planner/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "lib/error.h"

namespace dhelix {
namespace {

std::string labels(const std::vector<PipelineTask>& tasks) {
  std::string text;
  for (const PipelineTask& task : tasks) {
    if (!text.empty()) text += " ";
    text += task.label();
  }
  return text;
}

// The worked example of pipeline_schedule.h.
TEST(PipelineSchedule, WorkedExampleW) {
  const PipelineSchedule s = make_w_schedule(2, 4);
  ASSERT_EQ(s.stages.size(), 2u);
  EXPECT_EQ(labels(s.stages[0]),
            "F0d F1d F0u H0 F2d+B0u F1u H1 F3d+B1u F2u+B0d H2 B2u F3u+B1d H3 B3u B2d B3d");
  EXPECT_EQ(labels(s.stages[1]), "F0d F0u F1d F1u F2d+B0u F2u+B0d F3d+B1u F3u+B1d B2u B2d B3u B3d");
  EXPECT_EQ(s.si_block_count(0), 4);
  EXPECT_EQ(s.si_block_count(1), 4);
  EXPECT_EQ(s.head_loss_stage, 0);
}

TEST(PipelineSchedule, OneFOneBIsMegatrons) {
  const PipelineSchedule s = make_one_f_one_b_schedule(2, 4);
  EXPECT_EQ(labels(s.stages[0]), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(labels(s.stages[1]), "F0 H0 B0 F1 H1 B1 F2 H2 B2 F3 H3 B3");
  const PipelineSchedule three = make_one_f_one_b_schedule(3, 2);  // m < pp
  EXPECT_EQ(labels(three.stages[0]), "F0 F1 B0 B1");
  EXPECT_EQ(labels(three.stages[1]), "F0 F1 B0 B1");
  EXPECT_EQ(labels(three.stages[2]), "F0 H0 B0 F1 H1 B1");
}

// m <= pp: no backward has a forward partner, so no SI block (the header explains).
TEST(PipelineSchedule, FewMicroBatchesGiveNoSiBlocks) {
  const PipelineSchedule s = make_w_schedule(3, 2);
  for (int64_t p = 0; p < 3; ++p) EXPECT_EQ(s.si_block_count(p), 0);
  EXPECT_EQ(labels(s.stages[0]), "F0d F1d F0u H0 B0u F1u H1 B1u B0d B1d");
  EXPECT_EQ(labels(s.stages[2]), "F0d F0u F1d F1u B0u B0d B1u B1d");
  const PipelineSchedule one = make_w_schedule(1, 3);
  EXPECT_EQ(labels(one.stages[0]), "F0d F0u H0 F1d+B0u F1u+B0d H1 F2d+B1u F2u+B1d H2 B2u B2d");
}

using Key = std::tuple<WorkPass, int64_t, ChunkSide, int64_t>;

// Every micro-batch's forward and backward of every chunk appears exactly once, SI blocks
// pair forward j with backward j-pp moving the same way, and a stage's backward of a chunk
// comes after its forward.
TEST(PipelineSchedule, EveryChunkPassExactlyOnce) {
  for (PipelineShape shape : {PipelineShape::kW, PipelineShape::kOneFOneB}) {
    for (int64_t pp = 1; pp <= 5; ++pp) {
      for (int64_t m = 1; m <= 9; ++m) {
        SCOPED_TRACE(std::string(pipeline_shape_name(shape)) + " pp " + std::to_string(pp) + " m " +
                     std::to_string(m));
        const PipelineSchedule s = make_schedule(shape, pp, m);
        std::map<Key, int> count;
        for (int64_t p = 0; p < pp; ++p) {
          std::map<Key, size_t> position;
          for (size_t i = 0; i < s.stages[p].size(); ++i) {
            const PipelineTask& task = s.stages[p][i];
            if (task.kind == TaskKind::kSiBlock) {
              EXPECT_EQ(task.forward_micro_batch, task.backward_micro_batch + pp);
              EXPECT_NE(task.forward_chunk, task.backward_chunk);  // down with up: same way
            }
            for (const WorkItem& w : task_work(task, p)) {
              count[{w.pass, w.micro_batch, w.chunk, w.stage}] += 1;
              position[{w.pass, w.micro_batch, w.chunk, w.stage}] = i;
            }
          }
          for (const auto& [key, index] : position) {
            if (std::get<0>(key) != WorkPass::kBackward) continue;
            const Key forward{WorkPass::kForward, std::get<1>(key), std::get<2>(key), p};
            ASSERT_TRUE(position.count(forward));
            EXPECT_LT(position[forward], index);
          }
        }
        const std::vector<ChunkSide> chunks =
            shape == PipelineShape::kW ? std::vector<ChunkSide>{ChunkSide::kDown, ChunkSide::kUp}
                                       : std::vector<ChunkSide>{ChunkSide::kWhole};
        size_t expected = 0;
        for (int64_t mb = 0; mb < m; ++mb) {
          for (int64_t p = 0; p < pp; ++p) {
            for (ChunkSide c : chunks) {
              EXPECT_EQ((count[{WorkPass::kForward, mb, c, p}]), 1);
              EXPECT_EQ((count[{WorkPass::kBackward, mb, c, p}]), 1);
              expected += 2;
            }
          }
          EXPECT_EQ((count[{WorkPass::kHeadLoss, mb, s.last_chunk, s.head_loss_stage}]), 1);
          expected += 1;
        }
        EXPECT_EQ(count.size(), expected);  // nothing else
        if (shape == PipelineShape::kW) {
          for (int64_t p = 0; p < pp; ++p)
            EXPECT_EQ(s.si_block_count(p), 2 * std::max<int64_t>(0, m - pp));
        }
      }
    }
  }
}

TEST(PipelineSchedule, InputsFollowTheW) {
  const PipelineSchedule s = make_w_schedule(3, 4);
  // Forward up on the last stage follows its own down chunk; backward up on stage 0 follows
  // the head-loss step; backward down on the last stage follows its own up chunk.
  EXPECT_EQ(work_inputs(s, {WorkPass::kForward, 1, ChunkSide::kUp, 2}),
            (std::vector<WorkItem>{{WorkPass::kForward, 1, ChunkSide::kDown, 2}}));
  EXPECT_EQ(work_inputs(s, {WorkPass::kBackward, 1, ChunkSide::kUp, 0}),
            (std::vector<WorkItem>{{WorkPass::kHeadLoss, 1, ChunkSide::kUp, 0},
                                   {WorkPass::kForward, 1, ChunkSide::kUp, 0}}));
  EXPECT_EQ(work_inputs(s, {WorkPass::kBackward, 1, ChunkSide::kDown, 2}),
            (std::vector<WorkItem>{{WorkPass::kBackward, 1, ChunkSide::kUp, 2},
                                   {WorkPass::kForward, 1, ChunkSide::kDown, 2}}));
  EXPECT_EQ(work_inputs(s, {WorkPass::kBackward, 1, ChunkSide::kDown, 0}),
            (std::vector<WorkItem>{{WorkPass::kBackward, 1, ChunkSide::kDown, 1},
                                   {WorkPass::kForward, 1, ChunkSide::kDown, 0}}));
  EXPECT_TRUE(work_inputs(s, {WorkPass::kForward, 1, ChunkSide::kDown, 0}).empty());
}

TEST(PipelineSchedule, NamesAndErrors) {
  EXPECT_STREQ(pipeline_scheme_name(PipelineScheme::kWaveletPlus), "wavelet+");
  EXPECT_EQ(scheme_shape(PipelineScheme::kIntraBatch), PipelineShape::kOneFOneB);
  EXPECT_EQ(scheme_shape(PipelineScheme::kDHelix), PipelineShape::kW);
  EXPECT_STREQ(task_kind_name(TaskKind::kSiBlock), "si_block");
  try {
    make_w_schedule(2, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "micro-batches = 0: a pipeline needs at least one micro-batch");
  }
  EXPECT_THROW(make_one_f_one_b_schedule(0, 4), Error);
}

}  // namespace
}  // namespace dhelix
