// runtime/train/moe_support.h: which MoE jobs dhelix-run refuses, by name, on each backend.
// Both run every MoE setting the planner writes; both refuse a shared expert whose width tp
// does not divide.

#include "runtime/train/moe_support.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/error.h"
#include "tests/runtime/stage_model_test_util.h"

namespace dhelix::rt {
namespace {

JobSpec moe_job() {
  JobSpec job = test::tiny_job(/*tp=*/1, /*sp=*/false);
  job.model.moe = MoeSpec{.num_experts = 4,
                          .top_k = 2,
                          .capacity_factor = 1.0,
                          .expert_ffn_hidden_size = 32,
                          .shared_expert_ffn_hidden_size = 0,
                          .aux_loss_coeff = 0.01};
  job.parallel.ep = 2;
  return job;
}

std::string refusal(const JobSpec& job, const std::string& backend) {
  try {
    refuse_unsupported_moe(job, "plan.json", backend);
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kUnsupported);
    return error.what();
  }
  return "";
}

TEST(MoeSupport, BothBackendsRunEveryMoeSetting) {
  std::vector<JobSpec> jobs = {moe_job()};
  JobSpec dropless = moe_job();
  dropless.model.moe->capacity_factor = 0.0;
  jobs.push_back(dropless);
  for (int64_t etp : {1, 2}) {
    JobSpec tp = test::tiny_job(/*tp=*/2, /*sp=*/true);
    tp.model.moe = moe_job().model.moe;
    tp.parallel.ep = 2;
    tp.parallel.expert_tp = etp;
    jobs.push_back(tp);
  }
  JobSpec cp = moe_job();
  cp.parallel.cp = 2;
  jobs.push_back(cp);
  JobSpec shared = moe_job();
  shared.model.moe->shared_expert_ffn_hidden_size = 64;
  jobs.push_back(shared);
  for (RecomputeGranularity granularity :
       {RecomputeGranularity::kFull, RecomputeGranularity::kSelective}) {
    JobSpec recompute = moe_job();
    recompute.parallel.recompute.granularity = granularity;
    jobs.push_back(recompute);
  }
  for (const JobSpec& job : jobs) {
    EXPECT_EQ(refusal(job, "cpu"), "");
    EXPECT_EQ(refusal(job, "cuda"), "");
  }
}

TEST(MoeSupport, ASharedExpertWidthTpDoesNotDivideIsRefusedEverywhere) {
  JobSpec shared = test::tiny_job(/*tp=*/2, /*sp=*/true);
  shared.model.moe = moe_job().model.moe;
  shared.model.moe->shared_expert_ffn_hidden_size = 65;
  for (const char* backend : {"cpu", "cuda"}) {
    EXPECT_NE(
        refusal(shared, backend).find("a shared expert of width 65 that tp = 2 does not divide"),
        std::string::npos);
  }
}

}  // namespace
}  // namespace dhelix::rt
