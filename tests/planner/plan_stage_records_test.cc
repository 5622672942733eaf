// The plan's task records of a schedule with split backward tasks (planner/plan_stage_records.h):
// each PipelineTask's BackwardSplit becomes its backward part's "work" (lib/plan/plan.h), and
// a W waits for no other stage (it reads only its own stage's I).
#include "planner/plan_stage_records.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "planner/baseline_schedules.h"

namespace dhelix {
namespace {

TEST(PlanStageRecords, SplitBackwardTasksCarryTheirWork) {
  // ZB-H1 on pp 2, 4 micro-batches: every backward split into I and W (1F1B shape).
  const PipelineSchedule schedule = make_zb_h1_schedule(2, 4);
  StageCosts costs;
  costs.forward_chunk_us = 1;
  costs.backward_chunk_us = 2;
  costs.backward_weight_chunk_us = 1;
  const PipelineSimulation simulation = simulate_pipeline(schedule, {costs, costs});
  const std::vector<PlanStagePhases> phases(2);
  ParallelSpec parallel;
  parallel.pp = 2;
  const Placement placement(parallel, 8);
  const FoldedLayout folded = fold_layers(4, 2);
  const UnfoldedLayout unfolded = unfold_layers(4, 2);
  const std::vector<int64_t> shape_ranks = {0, 1}, pairing = {0, 0};
  const std::vector<PlanStage> stages = stage_records({.schedule = schedule,
                                                       .simulation = simulation,
                                                       .phases = phases,
                                                       .placement = placement,
                                                       .folded = folded,
                                                       .unfolded = unfolded,
                                                       .shape_ranks = shape_ranks,
                                                       .pairing_of_stage = pairing});
  ASSERT_EQ(stages.size(), 2u);
  for (const PlanStage& stage : stages) {
    int64_t inputs = 0, weights = 0;
    for (const PlanTask& task : stage.tasks) {
      if (task.kind != TaskKind::kBackward) continue;
      ASSERT_TRUE(task.backward.has_value());
      const char letter = task.label.front();
      if (letter == 'I') {
        EXPECT_EQ(task.backward->work, BackwardShare::kInput) << task.label;
        ++inputs;
      } else if (letter == 'W') {
        EXPECT_EQ(task.backward->work, BackwardShare::kWeight) << task.label;
        EXPECT_TRUE(task.waits_for.empty()) << task.label;
        ++weights;
      } else {
        EXPECT_EQ(task.backward->work, BackwardShare::kWhole) << task.label;
      }
    }
    EXPECT_EQ(inputs, 4) << "stage " << stage.stage;
    EXPECT_EQ(weights, 4) << "stage " << stage.stage;
  }
}

}  // namespace
}  // namespace dhelix
