// Absurd sizes inside a plan file (issue 37): every field a reader of the plan sizes or
// indexes something by, and every size of the plan's own job, is refused where the plan is
// read (read_plan / job_from_plan), with the file, the JSON pointer, the value and the
// rule. 2^62 layers or micro-batches used to end in std::bad_alloc (exit 70) in
// dhelix-plan --check, dhelix-run and dhelix-diff. And check 11 (lib/plan/plan_check_ops.cc):
// op records that differ from the layer DAGs rebuilt from the plan's job.

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "lib/error.h"
#include "lib/plan/plan_check.h"
#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"

namespace dhelix {
namespace {

Json plan_json(const std::string& name) {
  std::ifstream in(std::string(DHELIX_SOURCE_DIR) + "/examples/plans/" + name + ".json");
  return Json::parse(in);
}

// The message of the Error reading `json` and rebuilding its job raises; "" when none.
std::string refusal(const Json& json) {
  try {
    const Plan plan = plan_from_json(json, "p.json");
    job_from_plan(plan, "p.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidInput) << e.what();
    return e.what();
  }
  return "";
}

const std::string kHuge = std::to_string(int64_t{1} << 62);

TEST(PlanLimits, EverySizingFieldOfThePlanIsBounded) {
  const std::vector<std::string> pointers = {"/num_micro_batches",
                                             "/pairings/0/chunk_layers",
                                             "/pairings/0/window_layers",
                                             "/stages/0/stage",
                                             "/stages/0/ranks/0",
                                             "/stages/0/shape_rank",
                                             "/stages/0/down_layers/first",
                                             "/stages/0/down_layers/count",
                                             "/stages/0/up_layers/count",
                                             "/stages/0/tasks/0/index",
                                             "/stages/0/tasks/0/forward/micro_batch",
                                             "/stages/0/tasks/0/forward/layers/count",
                                             "/stages/0/tasks/0/head_loss_micro_batch",
                                             "/schemes/0/chunks_per_stage",
                                             "/schemes/0/memory/0/stage"};
  for (const std::string& pointer : pointers) {
    Json json = plan_json("tiny-tp2-pp2");
    json[Json::json_pointer(pointer)] = int64_t{1} << 62;
    const std::string message = refusal(json);
    EXPECT_NE(message.find("p.json: " + pointer + ": " + kHuge + " must be at most"),
              std::string::npos)
        << pointer << ": " << message;
  }
}

// The job inside the plan: every integer parallel setting the plan carries (and those it
// may carry), and the model's sizes, through /job and its copy in /inputs.
TEST(PlanLimits, EverySizeOfThePlansJobIsBounded) {
  const std::vector<std::string> keys = {"dp",
                                         "tp",
                                         "cp",
                                         "pp",
                                         "ep",
                                         "micro_batch_size",
                                         "global_batch_size",
                                         "seq_length",
                                         "expert_tp",
                                         "recompute_num_layers",
                                         "decoder_first_pipeline_num_layers",
                                         "decoder_last_pipeline_num_layers"};
  for (const std::string& key : keys) {
    Json json = plan_json("tiny-tp2-pp2");
    json["job"]["parallel"][key] = int64_t{1} << 62;
    json["inputs"]["parallel"][key] = int64_t{1} << 62;
    const std::string message = refusal(json);
    EXPECT_NE(message.find("/parallel/" + key + ": " + kHuge + " must be at most"),
              std::string::npos)
        << key << ": " << message;
  }
  for (const char* key :
       {"num_layers", "hidden_size", "num_attention_heads", "vocab_size", "ffn_hidden_size"}) {
    Json json = plan_json("tiny-tp2-pp2");
    json["job"]["model"][key] = int64_t{1} << 62;
    const std::string message = refusal(json);
    EXPECT_NE(message.find(std::string("/model/") + key + ": " + kHuge + " must be at most"),
              std::string::npos)
        << key << ": " << message;
  }
  Json experts = plan_json("tiny-moe-ep2");
  experts["job"]["model"]["moe"]["num_experts"] = int64_t{1} << 62;
  EXPECT_NE(refusal(experts).find("/model/moe/num_experts: " + kHuge + " must be at most"),
            std::string::npos);
}

// Sizes each within bounds whose products are not (the micro-batches of an iteration) are
// refused by the job's rules, which job_from_plan applies.
TEST(PlanLimits, ProductsOfBoundedSizesAreCheckedBeforeUse) {
  Json json = plan_json("tiny-tp2-pp2");
  json["job"]["parallel"]["global_batch_size"] = int64_t{1} << 32;
  json["job"]["parallel"]["micro_batch_size"] = 1;
  json["inputs"]["parallel"] = json["job"]["parallel"];
  const std::string message = refusal(json);
  EXPECT_NE(message.find("micro-batches per iteration; at most 1048576 are supported"),
            std::string::npos)
      << message;
}

TEST(PlanLimits, ShippedPlansAreWithinEveryBound) {
  for (const char* name :
       {"tiny-tp2", "tiny-tp2-pp2", "tiny-cp2-tp2", "tiny-dp2-tp2", "tiny-moe-ep2",
        "tiny-moe-ep2-pp2", "tiny-tp2-recompute", "llama-25b-a40-dp8-tp8"}) {
    EXPECT_EQ(refusal(plan_json(name)), "") << name;
  }
}

// ----- check 11: op records against the DAGs rebuilt from the plan's job -------------------

std::string check_edited(const std::function<void(Plan&)>& edit) {
  Plan plan = read_plan(std::string(DHELIX_SOURCE_DIR) + "/examples/plans/tiny-tp2-pp2.json");
  edit(plan);
  PlanCheckReport report;
  check_op_records(plan, job_from_plan(plan, "p.json"), "p.json", report.problems);
  std::string out;
  for (const Problem& p : report.problems.problems()) out += p.to_string() + "\n";
  return out;
}

TEST(PlanCheckOps, ShippedPlansRecordTheirDagsOps) {
  EXPECT_EQ(check_edited([](Plan&) {}), "");
}

TEST(PlanCheckOps, AnEditedSignatureIsNamedWithTheRecomputedOne) {
  std::string original;
  const std::string problems = check_edited([&](Plan& p) {
    original = p.pairings[0].forward_ops[0].signature;
    p.pairings[0].forward_ops[0].signature = "gemm:bf16:m=1,n=1,k=1";
  });
  EXPECT_EQ(problems,
            "p.json: /pairings/0/forward_ops/0/signature: \"gemm:bf16:m=1,n=1,k=1\" "
            "differs from \"" +
                original + "\", the signature of the layer DAG rebuilt from the plan's own /job\n");
}

TEST(PlanCheckOps, EditedKindStreamGroupAndIdAreNamed) {
  const std::string problems = check_edited([](Plan& p) {
    PlanOp& op = p.pairings[0].backward_ops[1];
    op.stream =
        op.stream == StreamClass::kCompute ? StreamClass::kLocalComm : StreamClass::kCompute;
    op.group = op.group ? std::nullopt : std::optional(ParallelDim::kDp);
    p.pairings[0].backward_ops[2].id = "bwd.no_such_op";
  });
  EXPECT_NE(problems.find("/pairings/0/backward_ops/1/stream"), std::string::npos) << problems;
  EXPECT_NE(problems.find("/pairings/0/backward_ops/1/group"), std::string::npos) << problems;
  EXPECT_NE(problems.find("/pairings/0/backward_ops/2/id: \"bwd.no_such_op\" names no op"),
            std::string::npos)
      << problems;
}

TEST(PlanCheckOps, CheckPlanRunsIt) {
  Plan plan = read_plan(std::string(DHELIX_SOURCE_DIR) + "/examples/plans/tiny-tp2.json");
  plan.pairings[0].forward_ops[0].signature = "edited";
  const PlanCheckReport report = check_plan(plan, "p.json");
  EXPECT_FALSE(report.ok());
}

}  // namespace
}  // namespace dhelix
