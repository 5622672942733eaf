// The plan checker's classes of ranks (lib/plan/plan_check_classes.cc): the invariant it
// rests on (ranks with equal lowering inputs run the same program but for rank and peers),
// the same summary as checking every rank, and "cannot tell" for every broken plan, so
// that check_plan's messages come from checking every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lib/placement.h"
#include "lib/plan/plan_check.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"

namespace dhelix {
namespace {

std::string plan_path(const std::string& name) {
  return std::string(DHELIX_SOURCE_DIR) + "/examples/plans/" + name + ".json";
}

const std::vector<std::string> kTinyPlans = {"tiny-tp2", "tiny-dp2-tp2", "tiny-tp2-pp2",
                                             "tiny-tp2-recompute"};

// Everything of an instruction but its peer.
bool same_but_peer(const Instruction& a, const Instruction& b) {
  return a.kind == b.kind && a.op == b.op && a.layer == b.layer && a.micro_batch == b.micro_batch &&
         a.stream == b.stream && a.group == b.group && a.collective == b.collective &&
         a.bytes == b.bytes && a.peer_stage == b.peer_stage && a.tag == b.tag &&
         a.gradient == b.gradient && a.task == b.task && a.block == b.block && a.deps == b.deps;
}

TEST(RankClasses, RanksWithEqualInputsRunOneProgramButForRankAndPeers) {
  for (const std::string& name : kTinyPlans) {
    const Plan plan = read_plan(plan_path(name));
    const JobSpec job = job_from_plan(plan, name);
    const Placement placement(job.parallel, job.cluster.gpus_per_node);
    for (ExecutionMode mode : {ExecutionMode::kCoExecuted, ExecutionMode::kSequential}) {
      for (int64_t a = 0; a < placement.world_size(); ++a) {
        const RankLoweringInput input_a(plan, job, a);
        const RankProgram pa = lower_rank_program(plan, job, a, mode);
        for (int64_t b = 0; b < placement.world_size(); ++b) {
          if (!(RankLoweringInput(plan, job, b) == input_a)) continue;
          const RankProgram pb = lower_rank_program(plan, job, b, mode);
          EXPECT_EQ(pb.rank, b);
          EXPECT_EQ(pb.stage, pa.stage);
          ASSERT_EQ(pa.instructions.size(), pb.instructions.size()) << name << " " << a << b;
          for (size_t i = 0; i < pa.instructions.size(); ++i) {
            const Instruction& x = pa.instructions[i];
            const Instruction& y = pb.instructions[i];
            ASSERT_TRUE(same_but_peer(x, y)) << name << " ranks " << a << ", " << b << " at " << i;
            if (x.kind != InstructionKind::kSend && x.kind != InstructionKind::kRecv) {
              EXPECT_EQ(y.peer, -1);
              continue;
            }
            RankCoordinates peer = placement.coordinates(b);
            peer.pp = y.peer_stage;
            EXPECT_EQ(y.peer, placement.rank_of(peer));
            EXPECT_EQ(placement.coordinates(y.peer).pp, y.peer_stage);
          }
        }
      }
    }
  }
}

TEST(RankClasses, ShippedPlansHaveOneClassPerStage) {
  // Not needed for correctness (more classes are checked as well), but what makes the
  // check fast: the shapes lowering does not read (vocabulary shards) must not split a stage.
  for (const std::string& name : kTinyPlans) {
    const Plan plan = read_plan(plan_path(name));
    const JobSpec job = job_from_plan(plan, name);
    for (const PlanStage& stage : plan.stages) {
      const RankLoweringInput first(plan, job, stage.ranks.front());
      for (int64_t rank : stage.ranks) {
        EXPECT_TRUE(RankLoweringInput(plan, job, rank) == first) << name << " rank " << rank;
      }
    }
  }
}

// The summary of checking every rank's lowered programs (checks 1 to 4).
PlanCheckSummary every_rank_summary(const Plan& plan, const JobSpec& job) {
  PlanCheckReport report;
  std::vector<RankProgram> programs;
  for (int64_t rank = 0; rank < job.parallel.world_size(); ++rank) {
    programs.push_back(lower_rank_program(plan, job, rank, ExecutionMode::kCoExecuted));
  }
  check_programs(plan, job, programs, "p.json", report);
  EXPECT_TRUE(report.ok());
  return report.summary;
}

TEST(RankClasses, PassWithTheSummaryOfEveryRank) {
  for (const std::string& name : kTinyPlans) {
    const Plan plan = read_plan(plan_path(name));
    const JobSpec job = job_from_plan(plan, name);
    std::vector<std::pair<int64_t, int64_t>> steps;
    const std::optional<PlanCheckSummary> classes = check_rank_classes(
        plan, job, "p.json", [&](int64_t done, int64_t total) { steps.emplace_back(done, total); });
    ASSERT_TRUE(classes.has_value()) << name;
    const PlanCheckSummary all = every_rank_summary(plan, job);
    EXPECT_EQ(classes->ranks, all.ranks) << name;
    EXPECT_EQ(classes->instructions, all.instructions) << name;
    EXPECT_EQ(classes->collective_groups, all.collective_groups) << name;
    EXPECT_EQ(classes->collectives, all.collectives) << name;
    EXPECT_EQ(classes->transfers, all.transfers) << name;
    // Progress: never backwards, and it ends at its total.
    ASSERT_FALSE(steps.empty());
    for (size_t i = 1; i < steps.size(); ++i) EXPECT_GE(steps[i].first, steps[i - 1].first);
    EXPECT_EQ(steps.back().first, steps.back().second);
  }
}

TEST(RankClasses, OneClassPerRankGivesTheSameSummary) {
  // Every rank a class: collectives compared across classes, quotient groups of several
  // classes, peers in other classes; the quotient is then the world itself.
  for (const std::string& name : kTinyPlans) {
    const Plan plan = read_plan(plan_path(name));
    const JobSpec job = job_from_plan(plan, name);
    std::string why;
    const std::optional<PlanCheckSummary> split =
        check_rank_classes(plan, job, "p.json", {}, &why, true);
    ASSERT_TRUE(split.has_value()) << name << ": " << why;
    const PlanCheckSummary all = every_rank_summary(plan, job);
    EXPECT_EQ(split->instructions, all.instructions) << name;
    EXPECT_EQ(split->collective_groups, all.collective_groups) << name;
    EXPECT_EQ(split->collectives, all.collectives) << name;
    EXPECT_EQ(split->transfers, all.transfers) << name;
  }
}

// ----- broken plans: the classes cannot tell, and every rank is checked ------------------

// Why the classes cannot tell; "" when they pass.
std::string why_not(const Plan& plan, bool class_per_rank = false) {
  std::string why;
  const auto summary =
      check_rank_classes(plan, job_from_plan(plan, "p.json"), "p.json", {}, &why, class_per_rank);
  EXPECT_EQ(summary.has_value(), why.empty());
  return why;
}

TEST(RankClasses, WaitCycleIsNotPassed) {
  // The quotient's simulation must find the cycle the world's has (plan_check_test.cc).
  Plan plan = read_plan(plan_path("tiny-tp2-pp2"));
  std::swap(plan.stages[0].tasks[1], plan.stages[0].tasks[2]);
  std::vector<PlanTask>& s1 = plan.stages[1].tasks;
  std::rotate(s1.begin(), s1.begin() + 2, s1.begin() + 4);
  EXPECT_EQ(why_not(plan), "co-executed: check 4 (no deadlock)");
  EXPECT_EQ(why_not(plan, true), "co-executed: check 4 (no deadlock)");
  const PlanCheckReport report = check_plan(plan, "cycle.json");
  bool cycle = false;
  for (const Problem& p : report.problems.problems()) {
    cycle = cycle || p.to_string().find("wait cycle") != std::string::npos;
  }
  EXPECT_TRUE(cycle);
}

TEST(RankClasses, RankMissingFromItsStageIsNotPassed) {
  Plan plan = read_plan(plan_path("tiny-dp2-tp2"));
  plan.stages[0].ranks.pop_back();
  EXPECT_EQ(why_not(plan), "a rank has no stage program");
  const PlanCheckReport report = check_plan(plan, "p.json");
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.problems.problems().front().to_string().find(
                "rank 3 does not lower: plan: stage 0 task -1: rank 3 is not among the stage's "
                "ranks"),
            std::string::npos);
}

TEST(RankClasses, OpDroppedFromABlockIsNotPassed) {
  Plan plan = read_plan(plan_path("tiny-tp2"));
  PlanPairing& pairing = plan.pairings[0];
  std::vector<PlanBlock>& blocks =
      pairing.window_blocks.empty() ? pairing.layer_blocks : pairing.window_blocks;
  // A weight-gradient op nothing waits for: the programs still run, check 9 must refuse.
  for (PlanBlock& block : blocks) {
    auto it = std::find_if(block.timings.begin(), block.timings.end(),
                           [](const auto& t) { return t.op.find("wgrad") != std::string::npos; });
    if (it == block.timings.end()) continue;
    block.timings.erase(it);
    break;
  }
  EXPECT_EQ(why_not(plan), "check 9 (same ops)");
  EXPECT_FALSE(check_plan(plan, "p.json").ok());
}

TEST(RankClasses, ShippedPlansPass) {
  for (const std::string& name : kTinyPlans) EXPECT_EQ(why_not(read_plan(plan_path(name))), "");
}

TEST(RankClasses, WrongWaitsForIsNotPassed) {
  Plan plan = read_plan(plan_path("tiny-tp2-pp2"));
  for (PlanTask& task : plan.stages[1].tasks) task.waits_for.clear();
  EXPECT_EQ(why_not(plan), "check 10 (waits_for)");
}

}  // namespace
}  // namespace dhelix
