#include "planner/w_split_drain.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lib/error.h"

namespace dhelix {
namespace {

// Every stage: forward chunk f, backward chunk b of which w is weight gradient, SI block si.
std::vector<StageCosts> uniform(int64_t pp, double f, double b, double w, double si) {
  StageCosts c;
  c.forward_chunk_us = f;
  c.backward_chunk_us = b;
  c.backward_weight_chunk_us = w;
  c.si_block_us = si;
  return std::vector<StageCosts>(static_cast<size_t>(pp), c);
}

std::string timeline_text(const StageSimulation& stage) {
  std::string text;
  for (const TimelineEntry& e : stage.timeline) {
    if (!text.empty()) text += " ";
    text += e.task.label() + "@" + std::to_string(static_cast<int>(e.start_us));
  }
  return text;
}

// The header's worked example: pp = 2, m = 4, forward 1, backward 2 (weight gradient 1),
// SI blocks 3. Unsplit the iteration takes 30; split, 28: the drain's I chain at speed 1.
TEST(WSplitDrain, HandTimed) {
  const auto costs = uniform(2, 1, 2, 1, 3);
  const PipelineSchedule w = make_w_schedule(2, 4);
  EXPECT_DOUBLE_EQ(simulate_pipeline(w, costs).iteration_us, 30);
  const PipelineSimulation split = simulate_pipeline(split_w_drain(w, costs), costs);
  EXPECT_DOUBLE_EQ(split.iteration_us, 28);
  EXPECT_EQ(timeline_text(split.stages[0]),
            "F0d@0 F1d@1 F0u@3 H0@4 F2d+B0u@4 F1u@7 H1@8 F3d+B1u@8 F2u+B0d@13 H2@16 I2u@16 "
            "W2u@17 F3u+B1d@19 H3@22 I3u@22 I2d@23 W3u@24 I3d@25 W2d@26 W3d@27");
  EXPECT_EQ(timeline_text(split.stages[1]),
            "F0d@1 F0u@2 F1d@3 F1u@4 F2d+B0u@7 F2u+B0d@10 F3d+B1u@13 F3u+B1d@16 I2u@19 I2d@20 "
            "W2u@21 W2d@22 I3u@23 I3d@24 W3u@25 W3d@26");
  // At most one W waiting: after I2d stage 0 runs W3u at once, so I3d starts a unit later
  // (the iteration still ends at 28: stage 0's last W was going to run anyway).
  const PipelineSimulation bounded = simulate_pipeline(split_w_drain(w, costs, 1), costs);
  const std::string stage0 = timeline_text(bounded.stages[0]);
  EXPECT_EQ(stage0.substr(stage0.find("I3u")), "I3u@22 I2d@23 W3u@24 W2d@25 I3d@26 W3d@27");
}

// Each stage's lone backwards are split exactly once, each W after its I, SI blocks and
// every other task unchanged and in order; never more than max_deferred W waiting when another task
// starts; and on uniform costs the split drain is never slower than the whole backwards.
TEST(WSplitDrain, SplitsEveryLoneBackwardOnce) {
  for (int64_t pp = 1; pp <= 6; ++pp) {
    for (int64_t m = 1; m <= 12; ++m) {
      for (const double weight : {0.4, 1.0, 1.6}) {
        const auto costs = uniform(pp, 1, 2, weight, 2.5);
        const PipelineSchedule w = make_w_schedule(pp, m);
        for (const int64_t bound : {int64_t{0}, int64_t{1}, int64_t{3}, kUnboundedDeferral}) {
          const PipelineSchedule split = split_w_drain(w, costs, bound);
          SCOPED_TRACE(testing::Message() << "pp " << pp << " m " << m << " bound " << bound);
          EXPECT_EQ(weight_gradient_tasks(split), 2 * pp * std::min(m, pp));
          for (size_t s = 0; s < w.stages.size(); ++s) {
            std::vector<std::string> others, inputs_pending;
            int64_t pending = 0;
            for (const PipelineTask& task : split.stages[s]) {
              if (task.backward_split != BackwardSplit::kWeight) {
                EXPECT_LE(pending, bound);
              }
              if (task.backward_split == BackwardSplit::kInput) {
                ++pending;
                inputs_pending.push_back(task.label().substr(1));
                others.push_back("B" + task.label().substr(1));
              } else if (task.backward_split == BackwardSplit::kWeight) {
                --pending;
                const auto it =
                    std::find(inputs_pending.begin(), inputs_pending.end(), task.label().substr(1));
                ASSERT_NE(it, inputs_pending.end()) << task.label() << " before its I";
                inputs_pending.erase(it);
              } else {
                others.push_back(task.label());
              }
            }
            EXPECT_TRUE(inputs_pending.empty());
            std::vector<std::string> original;
            for (const PipelineTask& task : w.stages[s]) original.push_back(task.label());
            EXPECT_EQ(others, original);
          }
          if (bound == kUnboundedDeferral) {
            EXPECT_LE(simulate_pipeline(split, costs).iteration_us,
                      simulate_pipeline(w, costs).iteration_us + 1e-9);
          }
        }
      }
    }
  }
}

TEST(WSplitDrain, RefusesOtherShapes) {
  EXPECT_THROW(split_w_drain(make_one_f_one_b_schedule(2, 4), uniform(2, 1, 2, 1, 3)), Error);
}

}  // namespace
}  // namespace dhelix
