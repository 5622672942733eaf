// The split backward (plan schema 1.3.0, docs/plan.md "Split backward"): a backward task's
// "work" field in the file, the lowering of an input part I and a weight part W into rank
// programs, the rules the lowering enforces, and the checker on a split plan.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "lib/error.h"
#include "lib/plan/plan_check.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"
#include "lib/plan/plan_writer.h"
#include "lib/plan/rank_program.h"
#include "tests/plan/split_backward.h"

namespace dhelix {
namespace {

using testing::split_lone_backwards;

struct Loaded {
  Plan plan;
  JobSpec job;
};

// tiny-tp2-pp2: TP 2 with SP, PP 2 (the W), 4 layers, 4 micro-batches; each stage ends in
// lone backward tasks (stage 0: B2u, B3u, B2d, B3d).
Loaded load_tiny() {
  const std::string path = std::string(DHELIX_SOURCE_DIR) + "/examples/plans/tiny-tp2-pp2.json";
  Loaded l{read_plan(path), {}};
  l.job = job_from_plan(l.plan, "tiny-tp2-pp2.json");
  return l;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

std::string read_error(const Json& json) {
  return error_of([&] { plan_from_json(json, "plan.json"); });
}

std::string lowering_error(const Plan& plan, const JobSpec& job, int64_t rank = 0) {
  return error_of([&] { lower_rank_program(plan, job, rank, ExecutionMode::kCoExecuted); });
}

size_t task_at(const PlanStage& stage, const std::string& label) {
  for (size_t i = 0; i < stage.tasks.size(); ++i) {
    if (stage.tasks[i].label == label) return i;
  }
  ADD_FAILURE() << "no task " << label;
  return 0;
}

// ----- the file ---------------------------------------------------------------------------

TEST(SplitBackward, WorkFieldRoundTripsAndIsAbsentWhenWhole) {
  Loaded l = load_tiny();
  const std::string whole = plan_to_text(l.plan);
  EXPECT_EQ(whole.find("\"work\""), std::string::npos);  // unsplit plans keep their bytes
  split_lone_backwards(l.plan, 1);
  // plan_from_json sorts the embedded job's keys (as PlanIo's round trip says): compare
  // the second writing with the third.
  const std::string text =
      plan_to_text(plan_from_json(Json::parse(plan_to_text(l.plan)), "split.json"));
  const Plan read = plan_from_json(Json::parse(text), "split.json");
  EXPECT_EQ(plan_to_text(read), text);
  const PlanStage& stage = read.stages[0];
  const PlanTask& input = stage.tasks[task_at(stage, "I2u")];
  const PlanTask& weight = stage.tasks[task_at(stage, "W2u")];
  EXPECT_EQ(input.backward->work, BackwardShare::kInput);
  EXPECT_EQ(weight.backward->work, BackwardShare::kWeight);
  EXPECT_EQ(weight.index, input.index + 2);  // one task of the original list between them
  const Json json = Json::parse(text);
  EXPECT_EQ(json["stages"][0]["tasks"][input.index]["backward"]["work"], "input");
  EXPECT_FALSE(json["stages"][0]["tasks"][0]["forward"].contains("work"));
  EXPECT_EQ(json["schema_version"], "1.3.0");
}

TEST(SplitBackward, ReaderRefusesBadWorkWithItsPointer) {
  Loaded l = load_tiny();
  split_lone_backwards(l.plan, 1);
  const Json good = Json::parse(plan_to_text(l.plan));
  const size_t i = task_at(l.plan.stages[0], "I2u");

  Json json = good;
  json["stages"][0]["tasks"][i]["backward"]["work"] = "half";
  EXPECT_NE(read_error(json).find(fmt::format("plan.json: /stages/0/tasks/{}/backward/work: "
                                              "\"half\"",
                                              i)),
            std::string::npos)
      << read_error(json);

  json = good;
  json["stages"][0]["tasks"][0]["forward"]["work"] = "input";
  EXPECT_EQ(read_error(json),
            "plan.json: /stages/0/tasks/0/forward/work: \"input\" a forward part runs whole; only "
            "a backward part may be split");

  // tiny-tp2-pp2's stage 0 task 4 is the SI block F2d+B0u.
  json = good;
  ASSERT_EQ(json["stages"][0]["tasks"][4]["kind"], "si_block");
  json["stages"][0]["tasks"][4]["backward"]["work"] = "weight";
  EXPECT_EQ(read_error(json),
            "plan.json: /stages/0/tasks/4/backward/work: \"weight\" only a task of kind backward "
            "may split its backward (input / weight); this task is si_block, whose backward "
            "runs whole");
}

// ----- the lowering -----------------------------------------------------------------------

// Per task: the backward layer ops it runs, in program order.
std::map<int64_t, std::vector<std::string>> backward_ops_by_task(const RankProgram& program) {
  std::map<int64_t, std::vector<std::string>> out;
  for (const Instruction& in : program.instructions) {
    if (in.layer >= 0 && std::string_view(in.op).starts_with("bwd.")) {
      out[in.task].push_back(std::string(in.op));
    }
  }
  return out;
}

// Hand-checked against lib/dag_builder.cc (TP 2 with SP): the backward of a layer is 18
// ops; its weight-gradient GEMMs are fc2, fc1, proj and qkv, each hanging off the gradient
// of its GEMM's output: the gathered MLP output gradient (allgather_mlp), the SwiGLU
// backward, the gathered attention output gradient (allgather_attn) and the core attention
// backward.
TEST(SplitBackward, InputPartRunsAllButTheWeightGemmsAndWeightPartOnlyThem) {
  Loaded l = load_tiny();
  split_lone_backwards(l.plan, 1);
  const PlanStage& stage = l.plan.stages[0];
  const auto input_task = static_cast<int64_t>(task_at(stage, "I2u"));
  const auto weight_task = static_cast<int64_t>(task_at(stage, "W2u"));
  for (ExecutionMode mode : {ExecutionMode::kCoExecuted, ExecutionMode::kSequential}) {
    const RankProgram program = lower_rank_program(l.plan, l.job, 0, mode);
    const auto ops = backward_ops_by_task(program);
    const std::vector<std::string> input = ops.at(input_task);
    EXPECT_EQ(input.size(), 14u);
    for (const std::string& op : input) EXPECT_FALSE(op.ends_with("_wgrad")) << op;
    EXPECT_EQ(ops.at(weight_task), (std::vector<std::string>{"bwd.fc2_wgrad", "bwd.fc1_wgrad",
                                                             "bwd.proj_wgrad", "bwd.qkv_wgrad"}));
    // Each W op waits for the I instruction that made its input (same micro-batch, layer).
    const std::map<std::string, std::string> input_of = {{"bwd.fc2_wgrad", "bwd.allgather_mlp"},
                                                         {"bwd.fc1_wgrad", "bwd.swiglu"},
                                                         {"bwd.proj_wgrad", "bwd.allgather_attn"},
                                                         {"bwd.qkv_wgrad", "bwd.flash_attn"}};
    std::map<std::string, int64_t> at;
    for (size_t i = 0; i < program.instructions.size(); ++i) {
      const Instruction& in = program.instructions[i];
      if (in.task == input_task) at[std::string(in.op)] = static_cast<int64_t>(i);
    }
    int checked = 0;
    for (const Instruction& in : program.instructions) {
      if (in.task != weight_task) continue;
      EXPECT_EQ(in.micro_batch, 2);
      EXPECT_EQ(in.layer, 3);  // stage 0's up chunk
      const int64_t producer = at.at(input_of.at(std::string(in.op)));
      EXPECT_TRUE(std::find(in.deps.begin(), in.deps.end(), producer) != in.deps.end())
          << in.op << " in " << execution_mode_name(mode);
      ++checked;
    }
    EXPECT_EQ(checked, 4);
    // The embedding's backward stays with the input part of the down chunk (layer 0).
    const auto down_input = static_cast<int64_t>(task_at(stage, "I2d"));
    bool embedding = false;
    for (const Instruction& in : program.instructions) {
      if (in.op == "bwd.embedding" && in.micro_batch == 2) embedding = in.task == down_input;
    }
    EXPECT_TRUE(embedding);
  }
}

// Split or not, every rank runs the same ops, each once per micro-batch and layer.
TEST(SplitBackward, SplitPlanRunsTheSameOps) {
  Loaded whole = load_tiny();
  Loaded split = load_tiny();
  split_lone_backwards(split.plan, 2);
  for (int64_t rank = 0; rank < 4; ++rank) {
    for (ExecutionMode mode : {ExecutionMode::kCoExecuted, ExecutionMode::kSequential}) {
      std::multiset<std::tuple<int64_t, int64_t, std::string>> a, b;
      for (const Instruction& in :
           lower_rank_program(whole.plan, whole.job, rank, mode).instructions)
        a.insert({in.micro_batch, in.layer, std::string(in.op)});
      for (const Instruction& in :
           lower_rank_program(split.plan, split.job, rank, mode).instructions)
        b.insert({in.micro_batch, in.layer, std::string(in.op)});
      EXPECT_EQ(a, b) << "rank " << rank;
    }
  }
}

// The rules, each with its message naming the stage and task.
TEST(SplitBackward, LoweringRefusesSplitsThatBreakTheRules) {
  Loaded l = load_tiny();
  split_lone_backwards(l.plan, 1);
  const size_t i = task_at(l.plan.stages[0], "I2u");
  const size_t w = task_at(l.plan.stages[0], "W2u");
  EXPECT_EQ(lowering_error(l.plan, l.job), "");

  Plan p = l.plan;  // W before its I
  std::swap(p.stages[0].tasks[i], p.stages[0].tasks[w]);
  EXPECT_EQ(lowering_error(p, l.job),
            fmt::format("plan: stage 0 task {}: backward of micro-batch 2 chunk up (layer 3): "
                        "the weight part (W) has no earlier input part (I) on the stage: a W "
                        "reads what its I computed",
                        p.stages[0].tasks[i].index));

  p = l.plan;  // the W twice
  p.stages[0].tasks.back() = p.stages[0].tasks[w];
  EXPECT_NE(lowering_error(p, l.job).find("backward of micro-batch 2 chunk up (layer 3): the "
                                          "weight part (W) runs twice"),
            std::string::npos)
      << lowering_error(p, l.job);

  p = l.plan;  // the I twice (its W's slot)
  p.stages[0].tasks[w].backward->work = BackwardShare::kInput;
  EXPECT_NE(lowering_error(p, l.job).find("the input part (I) runs twice"), std::string::npos)
      << lowering_error(p, l.job);

  p = l.plan;  // a whole backward after the I
  p.stages[0].tasks[w].backward->work = BackwardShare::kWhole;
  p.stages[0].tasks[w].kind = TaskKind::kBackward;
  EXPECT_NE(lowering_error(p, l.job).find("a whole backward after its input part"),
            std::string::npos)
      << lowering_error(p, l.job);

  p = l.plan;  // an I with no W: the message names the I's task
  p.stages[0].tasks.erase(p.stages[0].tasks.begin() + static_cast<int64_t>(w));
  EXPECT_NE(lowering_error(p, l.job).find(fmt::format(
                "plan: stage 0 task {}: backward of micro-batch 2 layer 3: the input part (I) "
                "has no weight part (W) later on the stage",
                i)),
            std::string::npos)
      << lowering_error(p, l.job);

  p = l.plan;  // a split part inside an SI block built in memory (the reader refuses it too)
  ASSERT_EQ(p.stages[0].tasks[4].kind, TaskKind::kSiBlock);
  p.stages[0].tasks[4].backward->work = BackwardShare::kInput;
  EXPECT_EQ(lowering_error(p, l.job),
            "plan: stage 0 task 4: a input part inside a si_block task: only a task of kind "
            "backward may split its backward; an SI block's backward runs whole");
}

// ----- the checker ------------------------------------------------------------------------

TEST(SplitBackward, CheckerPassesASplitPlanAndRefusesTamperedOnes) {
  Loaded l = load_tiny();
  split_lone_backwards(l.plan, 2);
  const PlanCheckReport ok = check_plan(l.plan, "split.json");
  std::string problems;
  for (const Problem& p : ok.problems.problems()) problems += p.to_string() + "\n";
  EXPECT_TRUE(ok.ok()) << problems;
  EXPECT_GT(ok.summary.transfers, 0);

  // An I removed: its W has nothing to read, and the stage misses a backward.
  Plan removed = l.plan;
  std::vector<PlanTask>& tasks = removed.stages[1].tasks;
  const size_t i = task_at(removed.stages[1], "I3d");
  tasks.erase(tasks.begin() + static_cast<int64_t>(i));
  for (size_t t = 0; t < tasks.size(); ++t) tasks[t].index = static_cast<int64_t>(t);
  const PlanCheckReport bad = check_plan(removed, "removed.json");
  std::string text;
  for (const Problem& p : bad.problems.problems()) text += p.to_string() + "\n";
  EXPECT_NE(text.find("the weight part (W) has no earlier input part (I)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("the backward passes cover layers"), std::string::npos) << text;
}

}  // namespace
}  // namespace dhelix
