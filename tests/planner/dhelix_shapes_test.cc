// The dhelix plan's shape (planner/dhelix_shapes.h): auto takes the fastest candidate that
// fits, --shape w and v restrict the candidates, and the plan records the choice.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "lib/cluster_presets.h"
#include "lib/error.h"
#include "lib/job_validation.h"
#include "lib/model_reader.h"
#include "planner/plan_builder.h"
#include "profiler/interference.h"
#include "profiler/model_backend.h"
#include "tests/planner/llama8b_h100_job.h"
#include "tests/planner/model_plan.h"

namespace dhelix {
namespace {

// llama-8b's shapes with 16 layers on H100s, TP 2, PP 4, global batch `gbs` x 4096.
JobSpec job_of(int64_t gbs) { return test_jobs::llama8b_h100_job(4, gbs, "dhelix-shapes-test"); }

Plan plan_of(const JobSpec& job, ShapeRequest shape, bool allow_oom = true,
             bool split_backward = true) {
  return test_jobs::model_plan(
      job, {.shape = shape, .allow_oom = allow_oom, .split_backward = split_backward});
}

TEST(DhelixShapes, AutoTakesTheFastestCandidateThatFits) {
  const Plan plan = plan_of(job_of(16), ShapeRequest::kAuto);  // m = 16 >= 2·pp
  ASSERT_TRUE(plan.shape_choice.has_value());
  const PlanShapeChoice& choice = *plan.shape_choice;
  EXPECT_EQ(choice.requested, ShapeRequest::kAuto);
  bool tried_v = false, tried_split_w = false, tried_whole_w = false;
  for (const PlanShapeCandidate& c : choice.candidates) {
    tried_v = tried_v || c.shape == PipelineShape::kV;
    tried_split_w = tried_split_w || (c.shape == PipelineShape::kW && c.split_backward);
    tried_whole_w = tried_whole_w || (c.shape == PipelineShape::kW && !c.split_backward);
    if (c.fits) {
      EXPECT_GE(c.iteration_us, choice.candidates.front().iteration_us);
    }
  }
  EXPECT_TRUE(tried_v && tried_split_w && tried_whole_w);
  const PlanScheme* dhelix = plan.find_scheme(PipelineScheme::kDHelix);
  ASSERT_NE(dhelix, nullptr);
  EXPECT_EQ(dhelix->shape, choice.chosen);
  EXPECT_EQ(choice.candidates.front().shape, choice.chosen);
  EXPECT_DOUBLE_EQ(dhelix->iteration_us, choice.candidates.front().iteration_us);
  EXPECT_FALSE(choice.reason.empty());
  // The W split never loses to the W whole here, and the V's order is DualPipeV's, priced
  // like the generous dualpipev baseline.
  const PlanScheme* dualpipev = plan.find_scheme(PipelineScheme::kDualPipeV);
  ASSERT_NE(dualpipev, nullptr);
  for (const PlanShapeCandidate& c : choice.candidates) {
    if (c.shape == PipelineShape::kV) {
      EXPECT_DOUBLE_EQ(c.iteration_us, dualpipev->iteration_us);
    }
  }
  EXPECT_LE(dhelix->iteration_us, dualpipev->iteration_us);
}

TEST(DhelixShapes, ShapeWTriesTheWOnly) {
  const Plan plan = plan_of(job_of(16), ShapeRequest::kW);
  ASSERT_TRUE(plan.shape_choice.has_value());
  EXPECT_EQ(plan.shape_choice->chosen, PipelineShape::kW);
  for (const PlanShapeCandidate& c : plan.shape_choice->candidates) {
    EXPECT_EQ(c.shape, PipelineShape::kW);
  }
  EXPECT_EQ(plan.find_scheme(PipelineScheme::kDHelix)->shape, PipelineShape::kW);
  EXPECT_EQ(plan.shape_choice->reason.rfind("--shape w: the W", 0), 0u)
      << plan.shape_choice->reason;
}

TEST(DhelixShapes, ShapeVNeedsTwicePpMicroBatches) {
  const JobSpec job = job_of(4);  // m = 4 < 2·pp = 8
  try {
    plan_of(job, ShapeRequest::kV);
    FAIL() << "--shape v planned with 4 micro-batches on 4 stages";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("--shape v"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2·pp = 8"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("has 4"), std::string::npos) << e.what();
  }
  // auto says why it stayed with the W.
  const Plan plan = plan_of(job, ShapeRequest::kAuto);
  EXPECT_EQ(plan.shape_choice->chosen, PipelineShape::kW);
  EXPECT_NE(plan.shape_choice->reason.find("the V needs at least 2·pp = 8 micro-batches"),
            std::string::npos)
      << plan.shape_choice->reason;
}

// Where no candidate fits (and --allow-oom writes the plan anyway), auto takes the one that
// needs the least memory and says so; without --allow-oom the plan is refused.
TEST(DhelixShapes, NoShapeFits) {
  JobSpec job = job_of(16);
  // A roomy plan that takes the W or the V lists the folded candidates only; interleaved
  // stages (v 4 here) may need less.
  int64_t least = INT64_MAX;
  for (ShapeRequest shape : {ShapeRequest::kAuto, ShapeRequest::kInterleaved}) {
    const Plan roomy = plan_of(job, shape);
    for (const PlanShapeCandidate& c : roomy.shape_choice->candidates) {
      least = std::min(least, c.peak_bytes);
    }
  }
  job.cluster.gpu.memory_bytes = least;  // usable: less the reserve
  const Plan tight = plan_of(job, ShapeRequest::kAuto);
  EXPECT_FALSE(tight.shape_choice->candidates.front().fits);
  EXPECT_EQ(tight.shape_choice->candidates.front().peak_bytes, least);
  EXPECT_NE(tight.shape_choice->reason.find("no shape fits"), std::string::npos)
      << tight.shape_choice->reason;
  try {
    plan_of(job, ShapeRequest::kAuto, /*allow_oom=*/false);
    FAIL() << "a plan that fits no shape was written";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInfeasible);
  }
}

// --no-split-backward: the W with whole backwards only, as the paper runs it; no V.
TEST(DhelixShapes, NoSplitBackwardKeepsThePapersW) {
  const JobSpec job = job_of(16);
  const Plan plan = plan_of(job, ShapeRequest::kAuto, true, /*split_backward=*/false);
  ASSERT_EQ(plan.shape_choice->candidates.size(), 1u);
  EXPECT_EQ(plan.shape_choice->chosen, PipelineShape::kW);
  EXPECT_FALSE(plan.shape_choice->candidates.front().split_backward);
  EXPECT_EQ(plan.shape_choice->reason, "--no-split-backward: the W with whole backwards");
  for (const PlanStage& stage : plan.stages) {
    for (const PlanTask& task : stage.tasks) {
      if (task.backward) {
        EXPECT_EQ(task.backward->work, BackwardShare::kWhole) << task.label;
      }
    }
  }
  try {
    plan_of(job, ShapeRequest::kV, true, false);
    FAIL() << "--shape v with --no-split-backward planned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--shape v with --no-split-backward"), std::string::npos);
  }
}

}  // namespace
}  // namespace dhelix
