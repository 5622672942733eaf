// runtime/train/moe_support.h: which MoE jobs dhelix-run refuses, by name, on each backend.
// cuda runs EP with tp = 1 and a capacity factor, and names each part it is not built for.

#include "runtime/train/moe_support.h"

#include <gtest/gtest.h>

#include <string>

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

TEST(MoeSupport, BothBackendsRunExpertParallelLayersWithACapacity) {
  EXPECT_EQ(refusal(moe_job(), "cpu"), "");
  EXPECT_EQ(refusal(moe_job(), "cuda"), "");
}

TEST(MoeSupport, BothBackendsRunASharedExpert) {
  JobSpec shared = moe_job();
  shared.model.moe->shared_expert_ffn_hidden_size = 64;
  EXPECT_EQ(refusal(shared, "cpu"), "");
  EXPECT_EQ(refusal(shared, "cuda"), "");
}

TEST(MoeSupport, CudaNamesWhatItsLayerIsNotBuiltFor) {
  JobSpec dropless = moe_job();
  dropless.model.moe->capacity_factor = 0.0;
  EXPECT_NE(refusal(dropless, "cuda").find("dropless routing (moe.capacity_factor 0)"),
            std::string::npos);
  EXPECT_EQ(refusal(dropless, "cpu"), "");
  JobSpec tp = test::tiny_job(/*tp=*/2, /*sp=*/true);
  tp.model.moe = moe_job().model.moe;
  EXPECT_NE(refusal(tp, "cuda").find("with tensor parallelism (tp = 2, expert tp = 2)"),
            std::string::npos);
  JobSpec cp = moe_job();
  cp.parallel.cp = 2;
  EXPECT_EQ(refusal(cp, "cuda"),
            "plan.json: dhelix-run does not run mixture-of-experts layers (4 experts, top-2, "
            "ep = 2) with context parallelism (cp = 2) on the cuda backend yet; use --backend "
            "cpu");
  JobSpec recompute = moe_job();
  recompute.parallel.recompute.granularity = RecomputeGranularity::kFull;
  EXPECT_NE(refusal(recompute, "cuda").find("with activation recompute (full)"), std::string::npos);
}

}  // namespace
}  // namespace dhelix::rt
