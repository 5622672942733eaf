// Check 11's memory half (planner/plan_figures_check.h): the plan checker recomputes the
// memory budget and every stage's memory from the plan's own job, so that an out-of-memory
// plan whose figures were edited no longer passes "memory fits" (issue 37).

#include "planner/plan_figures_check.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "lib/plan/plan_check.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"

namespace dhelix {
namespace {

std::string plan_path(const std::string& name) {
  return std::string(DHELIX_SOURCE_DIR) + "/examples/plans/" + name;
}

std::string problems_of(const Plan& plan) {
  ProblemList problems;
  check_plan_memory_figures(plan, job_from_plan(plan, "p.json"), "p.json", problems);
  std::string out;
  for (const Problem& p : problems.problems()) out += p.to_string() + "\n";
  return out;
}

// The recomputation is byte for byte what dhelix-plan wrote: every shipped plan passes
// (dense, MoE, CP, PP, recompute, the A40 and H100 golden plans).
TEST(PlanFiguresCheck, EveryShippedPlanMatchesItsRecomputation) {
  int64_t plans = 0;
  for (const std::string& dir : {plan_path(""), plan_path("golden")}) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().extension() != ".json") continue;
      const Plan plan = read_plan(entry.path().string());
      EXPECT_EQ(problems_of(plan), "") << entry.path();
      ++plans;
    }
  }
  EXPECT_GE(plans, 12);
}

// The case: a plan that does not fit, whose budget was raised to make it "fit".
TEST(PlanFiguresCheck, AnEditedBudgetIsNamedWithTheRecomputedValue) {
  Plan plan = read_plan(plan_path("tiny-tp2-pp2.json"));
  const int64_t usable = plan.memory_budget.usable_bytes;
  plan.memory_budget.usable_bytes = usable * 4;
  plan.memory_budget.capacity_bytes += 1;
  EXPECT_EQ(problems_of(plan),
            "p.json: /memory_budget/capacity_bytes: 4294967297 differs from 4294967296 bytes "
            "recomputed from the plan's own /job (the plan was edited or corrupted; plan the job "
            "again)\n"
            "p.json: /memory_budget/usable_bytes: " +
                std::to_string(usable * 4) + " differs from " + std::to_string(usable) +
                " bytes recomputed from the plan's own /job (the plan was edited or corrupted; "
                "plan the job again)\n");
}

TEST(PlanFiguresCheck, EditedStageFiguresAreNamed) {
  Plan plan = read_plan(plan_path("tiny-tp2-pp2.json"));
  const PlanScheme* dhelix = plan.find_scheme(PipelineScheme::kDHelix);
  const auto index = static_cast<size_t>(dhelix - plan.schemes.data());
  PlanStageMemory& stage = plan.schemes[index].memory[1];
  stage.activation_bytes /= 2;
  stage.total_bytes /= 2;
  const std::string problems = problems_of(plan);
  const std::string at = "p.json: /schemes/" + std::to_string(index) + "/memory/1/";
  EXPECT_NE(problems.find(at + "activation_bytes: "), std::string::npos) << problems;
  EXPECT_NE(problems.find(at + "total_bytes: "), std::string::npos) << problems;
  plan.schemes[index].memory.pop_back();
  EXPECT_NE(problems_of(plan).find("must have one entry per pipeline stage: 2"), std::string::npos);
}

TEST(PlanFiguresCheck, AnEditedFitsFlagIsNamed) {
  Plan plan = read_plan(plan_path("tiny-tp2-pp2.json"));
  const PlanScheme* dhelix = plan.find_scheme(PipelineScheme::kDHelix);
  const auto index = static_cast<size_t>(dhelix - plan.schemes.data());
  plan.schemes[index].fits = false;
  EXPECT_NE(problems_of(plan).find("/schemes/" + std::to_string(index) +
                                   "/fits: false differs from true"),
            std::string::npos);
}

// Through check_plan, as dhelix-plan --check and dhelix-run call it: the OOM plan whose
// budget and stage figures were all lowered consistently still fails.
TEST(PlanFiguresCheck, CheckPlanWithTheRecomputationRefusesAConsistentlyEditedPlan) {
  Plan plan = read_plan(plan_path("tiny-tp2-pp2.json"));
  for (PlanScheme& scheme : plan.schemes) {
    for (PlanStageMemory& m : scheme.memory) {
      m.activation_bytes = 0;
      m.total_bytes = m.weight_bytes + m.gradient_bytes + m.optimizer_bytes;
    }
  }
  EXPECT_TRUE(check_plan(plan, "p.json").ok());  // what the checker alone believed
  const PlanCheckReport report = check_plan(plan, "p.json", {}, check_plan_memory_figures);
  EXPECT_FALSE(report.ok());
}

}  // namespace
}  // namespace dhelix
